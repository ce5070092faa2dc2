//! A throwaway `redis-server` on a free loopback port, without
//! persistence, killed on drop. Shared by tests/redis_quotas/redis_bucket.rs and
//! benches/redis_bucket.rs.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `redis-server`; killed (and reaped) on drop.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    args: Vec<String>,
}

/// Whether `redis-server` can be started here. When it cannot: with `CI`
/// set this panics (CI must really run these tests); otherwise it prints
/// why `what` is skipped and returns false.
pub fn available(what: &str) -> bool {
    let found = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !found {
        if std::env::var_os("CI").is_some() {
            panic!(
                "redis-server is not installed, and CI is set: install it \
                 (`apt-get install -y redis-server`) so {what} runs"
            );
        }
        eprintln!(
            "skipping {what}: redis-server is not installed (apt-get install -y redis-server)"
        );
    }
    found
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.local_addr().unwrap().port()
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers PING.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// [`start`](Self::start) with more arguments for `redis-server`.
    pub fn start_with(args: &[&str]) -> RedisServer {
        let mut server = RedisServer {
            child: None,
            port: free_port(),
            args: args.iter().map(|a| a.to_string()).collect(),
        };
        server.spawn();
        server
    }

    /// `redis://127.0.0.1:port/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server running").id()
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        let start = Instant::now();
        while self.command(&["PING"]).as_deref() != Some("+PONG") {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "redis-server on port {} did not answer PING",
                self.port
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Kills the server (the port stays ours to restart on).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts a fresh server on the same port.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// Freezes (`SIGSTOP`) or thaws (`SIGCONT`) the server: connections
    /// stay open but nothing answers, the slow-server case.
    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([sig, &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {sig} failed");
    }

    /// Sends one command over a fresh connection and returns the first line
    /// of the reply, or `None` if the server does not answer.
    pub fn command(&self, args: &[&str]) -> Option<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        stream
            .set_read_timeout(Some(Duration::from_millis(500)))
            .ok()?;
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            req.push_str(&format!("${}\r\n{}\r\n", a.len(), a));
        }
        stream.write_all(req.as_bytes()).ok()?;
        let mut buf = [0u8; 256];
        let mut reply = Vec::new();
        while !reply.ends_with(b"\r\n") {
            let n = stream.read(&mut buf).ok()?;
            if n == 0 {
                return None;
            }
            reply.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8_lossy(&reply);
        Some(text.lines().next().unwrap_or("").to_owned())
    }
}

impl RedisServer {
    /// Every key the server holds (`KEYS *`: a test server holds few).
    pub fn keys(&self) -> Vec<String> {
        use std::io::BufRead;
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        stream
            .write_all(b"*2\r\n$4\r\nKEYS\r\n$1\r\n*\r\n")
            .unwrap();
        let mut reader = std::io::BufReader::new(stream);
        let mut line = String::new();
        let mut next = |line: &mut String| {
            line.clear();
            reader.read_line(line).expect("a reply line");
            line.trim_end().to_owned()
        };
        let head = next(&mut line);
        let n: usize = head
            .strip_prefix('*')
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("KEYS answered {head:?}"));
        (0..n)
            .map(|_| {
                next(&mut line); // $len
                next(&mut line)
            })
            .collect()
    }

    /// `PTTL key` in milliseconds: -1 for a key that never expires, -2
    /// for one that is gone.
    pub fn pttl(&self, key: &str) -> i64 {
        let reply = self.command(&["PTTL", key]).expect("PTTL answered");
        reply[1..]
            .parse()
            .unwrap_or_else(|_| panic!("PTTL answered {reply:?}"))
    }

    /// Panics unless every key the server holds expires (a positive
    /// `PTTL`), naming the first that does not.
    pub fn assert_every_key_expires(&self) {
        for key in self.keys() {
            let pttl = self.pttl(&key);
            assert!(
                pttl > 0,
                "key {key:?} has PTTL {pttl}: it would never expire"
            );
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // SIGKILL ends a frozen (SIGSTOPped) server too.
        self.stop();
    }
}
