//! A loopback LLM that streams its replies (server-sent events), for the
//! streamed-reply tests of the reqwest middleware and the tower layer.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use backpressure::admission::{Admission, SlotPolicy};
use backpressure::{DefaultSleeper, ManualClock, Quota};

/// The layer both twins stream through: one global slot (a `probe` tool
/// call shows whether a stream holds it) and a 10,000 tokens-a-minute
/// quota (its estimate settled by the stream's usage).
pub fn admission() -> Admission<DefaultSleeper, ManualClock> {
    Admission::builder()
        .clock(ManualClock::new())
        .global_concurrency(1)
        .tool("probe", 1, SlotPolicy::FailFast)
        .resource(
            "tokens",
            Quota::per_minute(NonZeroU32::new(10_000).unwrap()),
        )
        .build()
}

/// A loopback LLM that streams (server-sent events): each request gets its
/// headers and a first event at once, then waits for `finish` to send the
/// final `usage` event and `[DONE]`, and closes. Returns its address and
/// the number of requests it accepted.
pub async fn streaming_server(
    finish: Arc<tokio::sync::Notify>,
) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let finish = finish.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    head.extend_from_slice(&buf[..n]);
                }
                let first = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n\
                             data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n";
                if s.write_all(first.as_bytes()).await.is_err() {
                    return;
                }
                finish.notified().await;
                let rest = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":700,\"completion_tokens\":105,\"total_tokens\":805}}\n\n\
                            data: [DONE]\n\n";
                let _ = s.write_all(rest.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    (addr, accepted)
}
