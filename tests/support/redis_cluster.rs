//! A throwaway 3-master Redis Cluster on loopback: three
//! `redis-server --cluster-enabled yes` on free ports, joined with
//! `redis-cli --cluster create`, each killed by pid on drop (and its
//! working directory removed). Used by tests/redis_quotas/redis_cluster.rs and the
//! scale example.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Held while a cluster picks its ports and starts: `free_port` only says a
/// port is free now, so two clusters starting at once (tests run in
/// parallel) could pick the same one. The loser's `redis-server` then
/// exits, the winner's node answers for it, and `--cluster create` waits
/// forever for a node that is not there.
static STARTING: Mutex<()> = Mutex::new(());

/// Three masters, no replicas.
pub struct RedisCluster {
    nodes: Vec<(u16, Child)>,
    dir: PathBuf,
}

/// Whether `redis-server` and `redis-cli` can be started here (as
/// `redis_server::available`: with `CI` set, their absence panics).
pub fn available(what: &str) -> bool {
    let ok = |bin: &str| {
        Command::new(bin)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    let found = ok("redis-server") && ok("redis-cli");
    if !found {
        if std::env::var_os("CI").is_some() {
            panic!("redis-server/redis-cli are not installed, and CI is set: install redis-server so {what} runs");
        }
        eprintln!("skipping {what}: redis-server/redis-cli are not installed");
    }
    found
}

/// A port no one listens on now, and whose cluster bus port (+10000) is
/// free too.
fn free_port() -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = listener.local_addr().unwrap().port();
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// `cli`, killed (and the test failed) if it has not finished within
/// `limit`: `--cluster create` waits without end for a node that never
/// joins, and a hung test is worse than a failed one.
fn cli_within(port: u16, args: &[&str], limit: Duration) -> Output {
    let mut child = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run redis-cli");
    let start = Instant::now();
    while child.try_wait().expect("poll redis-cli").is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("reap redis-cli");
            panic!(
                "redis-cli {args:?} did not finish within {limit:?}: {}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("read redis-cli's output")
}

fn cli(port: u16, args: &[&str]) -> Output {
    Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run redis-cli")
}

impl RedisCluster {
    /// Starts three masters and joins them; returns once every node says
    /// `cluster_state:ok`.
    pub fn start() -> RedisCluster {
        let dir = std::env::temp_dir().join(format!(
            "bp-redis-cluster-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("make the cluster's directory");
        let starting = STARTING.lock().unwrap_or_else(|e| e.into_inner());
        let mut nodes = Vec::new();
        for _ in 0..3 {
            let port = free_port();
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string()])
                .args(["--bind", "127.0.0.1"])
                .args(["--cluster-enabled", "yes"])
                .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
                .args(["--cluster-node-timeout", "5000"])
                .args(["--save", "", "--appendonly", "no"])
                .args(["--dir", dir.to_str().unwrap()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start redis-server");
            nodes.push((port, child));
        }
        let cluster = RedisCluster { nodes, dir };
        // Each port must be served by the process started for it (a PONG
        // alone could come from anyone's server on a reused port).
        for (port, child) in &cluster.nodes {
            let pid = format!("process_id:{}", child.id());
            cluster.wait_for(*port, &pid, &["INFO", "server"]);
        }
        drop(starting);
        let addrs: Vec<String> = cluster
            .ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"]);
        let out = cli_within(cluster.ports()[0], &args, Duration::from_secs(60));
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        for &port in &cluster.ports() {
            cluster.wait_for(port, "cluster_state:ok", &["CLUSTER", "INFO"]);
        }
        cluster
    }

    fn wait_for(&self, port: u16, needle: &str, args: &[&str]) {
        let start = Instant::now();
        loop {
            let out = cli(port, args);
            if String::from_utf8_lossy(&out.stdout).contains(needle) {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "node {port} never answered {needle} to {args:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The masters' ports.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|(p, _)| *p).collect()
    }

    /// Every node's URL, comma-separated: what the builders take for a
    /// cluster.
    pub fn urls(&self) -> String {
        self.ports()
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}/"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Runs `redis-cli` against node `port`; returns its trimmed stdout.
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        String::from_utf8_lossy(&cli(port, args).stdout)
            .trim()
            .to_owned()
    }

    /// The node id of `port`.
    pub fn id(&self, port: u16) -> String {
        self.cli(port, &["CLUSTER", "MYID"])
    }

    /// The port of the master serving `key`'s slot.
    pub fn owner(&self, key: &str) -> u16 {
        let slot: u16 = self
            .cli(self.ports()[0], &["CLUSTER", "KEYSLOT", key])
            .parse()
            .expect("a slot number");
        let nodes = self.cli(self.ports()[0], &["CLUSTER", "NODES"]);
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            for range in fields.iter().skip(8) {
                let (lo, hi) = match range.split_once('-') {
                    Some((lo, hi)) => (lo.parse().unwrap_or(u16::MAX), hi.parse().unwrap_or(0)),
                    None => match range.parse() {
                        Ok(s) => (s, s),
                        Err(_) => continue,
                    },
                };
                if (lo..=hi).contains(&slot) {
                    let addr = fields[1].split('@').next().unwrap();
                    return addr.rsplit(':').next().unwrap().parse().unwrap();
                }
            }
        }
        panic!("no master serves slot {slot}");
    }

    /// Keys stored on node `port`.
    pub fn dbsize(&self, port: u16) -> u64 {
        self.cli(port, &["DBSIZE"]).parse().unwrap_or(0)
    }

    /// The command that moves every slot of node `from` to node `to` with
    /// `redis-cli --cluster reshard` (keys migrate live); run it off the
    /// async workers.
    pub fn reshard_all(&self, from: u16, to: u16) -> Command {
        let slots = self.slot_count(from).to_string();
        let (from_id, to_id) = (self.id(from), self.id(to));
        let mut cmd = Command::new("redis-cli");
        cmd.args([
            "--cluster",
            "reshard",
            &format!("127.0.0.1:{}", self.ports()[0]),
            "--cluster-from",
            &from_id,
            "--cluster-to",
            &to_id,
            "--cluster-slots",
            &slots,
            "--cluster-yes",
            "--cluster-pipeline",
            "100",
        ])
        .stdin(Stdio::null());
        cmd
    }

    fn slot_count(&self, port: u16) -> u32 {
        let id = self.id(port);
        let nodes = self.cli(self.ports()[0], &["CLUSTER", "NODES"]);
        let line = nodes
            .lines()
            .find(|l| l.starts_with(&id))
            .expect("the node is in the cluster");
        line.split_whitespace()
            .skip(8)
            .map(|r| match r.split_once('-') {
                Some((lo, hi)) => hi.parse::<u32>().unwrap() - lo.parse::<u32>().unwrap() + 1,
                None => 1,
            })
            .sum()
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for (_, child) in &mut self.nodes {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
