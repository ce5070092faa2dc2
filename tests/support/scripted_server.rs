//! A loopback HTTP server that answers from a script, one step per request
//! in the order requests arrive, and records each request's start: the
//! server's side of the conformance table (issue #39).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the server does with one request.
#[derive(Clone, Debug)]
pub enum Step {
    /// Answers with this status and these headers (a tiny JSON body).
    Answer(u16, &'static [(&'static str, &'static str)]),
    /// Answers with this status and this JSON body.
    Body(u16, &'static str),
    /// The same, after a delay (so identical calls overlap).
    Slow(u16, Duration),
    /// Resets the connection once the request is read.
    Reset,
    /// Reads the request and never answers.
    Silent,
}

/// One request the server saw.
#[derive(Clone, Debug)]
pub struct Seen {
    pub at: Instant,
    pub method: String,
}

pub struct Scripted {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Scripted {
    /// Answers request `i` with `script[i]`, and every later one with `then`.
    pub async fn start(script: Vec<Step>, then: Step) -> Scripted {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let next = Arc::new(AtomicUsize::new(0));
        let (record, script) = (seen.clone(), Arc::new(script));
        let task = tokio::spawn(async move {
            // Connections held open by `Silent`, until the server stops.
            let held = Arc::new(Mutex::new(Vec::new()));
            while let Ok((stream, _)) = listener.accept().await {
                let (record, script, then, next, held) = (
                    record.clone(),
                    script.clone(),
                    then.clone(),
                    next.clone(),
                    held.clone(),
                );
                tokio::spawn(async move {
                    serve(stream, &record, &script, &then, &next, &held).await;
                });
            }
        });
        Scripted {
            addr,
            seen,
            task: Some(task),
        }
    }

    /// A port nothing listens on: every connection is refused.
    pub async fn closed() -> Scripted {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        Scripted {
            addr,
            seen: Arc::default(),
            task: None,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The record itself, for a task that watches it.
    pub fn seen_handle(&self) -> Arc<Mutex<Vec<Seen>>> {
        self.seen.clone()
    }

    /// Every request seen, in the order they started.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Scripted {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

async fn serve(
    mut stream: TcpStream,
    record: &Mutex<Vec<Seen>>,
    script: &[Step],
    then: &Step,
    next: &AtomicUsize,
    held: &Mutex<Vec<TcpStream>>,
) {
    let Some(method) = read_request(&mut stream).await else {
        return;
    };
    let i = next.fetch_add(1, Ordering::SeqCst);
    record.lock().unwrap().push(Seen {
        at: Instant::now(),
        method,
    });
    match script.get(i).unwrap_or(then) {
        Step::Answer(status, headers) => answer(&mut stream, *status, headers, i).await,
        Step::Body(status, body) => reply(&mut stream, *status, &[], body).await,
        Step::Slow(status, delay) => {
            tokio::time::sleep(*delay).await;
            answer(&mut stream, *status, &[], i).await;
        }
        Step::Reset => {
            // A zero linger closes with a reset at once (it blocks only
            // with a non-zero linger).
            #[allow(deprecated)]
            let _ = stream.set_linger(Some(Duration::ZERO));
            drop(stream);
        }
        Step::Silent => held.lock().unwrap().push(stream),
    }
}

/// Reads one request (head and body); its method.
async fn read_request(stream: &mut TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    head.split(' ').next().map(str::to_string)
}

async fn answer(stream: &mut TcpStream, status: u16, headers: &[(&str, &str)], i: usize) {
    reply(stream, status, headers, &format!("{{\"request\":{i}}}")).await;
}

async fn reply(stream: &mut TcpStream, status: u16, headers: &[(&str, &str)], body: &str) {
    let mut out = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str("\r\n");
    out.push_str(body);
    let _ = stream.write_all(out.as_bytes()).await;
    let _ = stream.shutdown().await;
}
