//! A streamed reply (server-sent events) keeps its call's ticket: the
//! slots stay held until the body is read to its end or dropped, so the
//! concurrency limit counts the streams still being read, and the usage
//! the stream reports (an LLM's final `usage` event) settles the call's
//! estimate when it ends.

use core::pin::Pin;
use core::task::{Context, Poll};
use std::sync::Arc;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use reqwest::Response;

use crate::admission::Ticket;
use crate::clock::Clock;
use crate::retry::Attempts;
use crate::sleep::Sleeper;

/// Reads what one event's data says it used.
pub(super) type EventUsage = dyn Fn(&[u8]) -> Vec<(String, u32)> + Send + Sync;

/// A line longer than this is not an event this reads (its usage is
/// skipped, the bytes still pass through): memory stays bounded whatever
/// the server sends.
const MAX_LINE: usize = 1 << 20;

/// The response body, holding the call's ticket.
struct Streamed<S: Sleeper, C: Clock> {
    inner: reqwest::Body,
    ticket: Option<Ticket<S, C>>,
    usage: Option<Arc<EventUsage>>,
    /// The event line being read, across frames.
    line: Vec<u8>,
    /// Whether the current line outgrew `MAX_LINE` (skipped to its end).
    skipping: bool,
    /// The most each quota name was reported to use.
    used: Vec<(String, u32)>,
}

impl<S: Sleeper, C: Clock> Streamed<S, C> {
    fn scan(&mut self, data: &[u8]) {
        if self.usage.is_none() {
            return;
        }
        for part in data.split_inclusive(|&b| b == b'\n') {
            let (bytes, ended) = match part.strip_suffix(b"\n") {
                Some(bytes) => (bytes, true),
                None => (part, false),
            };
            if !self.skipping {
                if self.line.len() + bytes.len() > MAX_LINE {
                    self.skipping = true;
                    self.line.clear();
                } else {
                    self.line.extend_from_slice(bytes);
                }
            }
            if ended {
                if !self.skipping {
                    self.event_line();
                }
                self.line.clear();
                self.skipping = false;
            }
        }
    }

    /// One complete line: a `data:` line is handed to the usage reader.
    fn event_line(&mut self) {
        let line = self.line.strip_suffix(b"\r").unwrap_or(&self.line);
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let data = data.strip_prefix(b" ").unwrap_or(data);
        let Some(read) = &self.usage else { return };
        for (name, units) in read(data) {
            match self.used.iter_mut().find(|(n, _)| *n == name) {
                Some((_, most)) => *most = (*most).max(units),
                None => self.used.push((name, units)),
            }
        }
    }

    /// The body ended: the usage it reported settles the ticket, which is
    /// then released.
    fn finish(&mut self) {
        // A last line with no newline.
        if !self.line.is_empty() && !self.skipping {
            self.event_line();
        }
        let Some(mut ticket) = self.ticket.take() else {
            return;
        };
        // Counts reported in parts (input at the start, output at the end)
        // add up to at least their total.
        let get = |used: &[(String, u32)], n: &str| {
            used.iter().find(|(name, _)| name == n).map(|(_, u)| *u)
        };
        if let (Some(input), Some(output)) = (
            get(&self.used, "input_tokens"),
            get(&self.used, "output_tokens"),
        ) {
            let sum = input.saturating_add(output);
            match self.used.iter_mut().find(|(n, _)| n == "tokens") {
                Some((_, total)) => *total = (*total).max(sum),
                None => self.used.push(("tokens".to_string(), sum)),
            }
        }
        for (name, units) in &self.used {
            ticket.settle(name, *units);
        }
    }
}

impl<S: Sleeper, C: Clock> Body for Streamed<S, C> {
    type Data = Bytes;
    type Error = reqwest::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, reqwest::Error>>> {
        // Unpin: every field is.
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let data = data.clone();
                    this.scan(&data);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                // Cut off mid-stream: no answer to settle with, and a
                // failure for the circuit.
                if let Some(ticket) = this.ticket.take() {
                    ticket.observe_error();
                }
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                this.finish();
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// `response` with its body holding `ticket` (and reading `usage` from
/// its events), and the requests sent as its `Attempts`.
pub(super) fn hold<S, C>(
    response: Response,
    ticket: Ticket<S, C>,
    usage: Option<Arc<EventUsage>>,
    sent: u32,
) -> Response
where
    S: Sleeper + Send + Sync + 'static,
    C: Clock + Send + Sync + 'static,
{
    use reqwest::ResponseBuilderExt;
    let url = response.url().clone();
    let (mut parts, body) = http::Response::<reqwest::Body>::from(response).into_parts();
    let body = Streamed {
        inner: body,
        ticket: Some(ticket),
        usage,
        line: Vec::new(),
        skipping: false,
        used: Vec::new(),
    };
    parts.extensions.insert(Attempts(sent));
    let mut rebuilt = http::Response::builder()
        .status(parts.status)
        .version(parts.version)
        .url(url)
        .body(reqwest::Body::wrap(body))
        .expect("the status and version came from a response");
    *rebuilt.headers_mut() = core::mem::take(&mut parts.headers);
    rebuilt.extensions_mut().extend(parts.extensions);
    Response::from(rebuilt)
}

/// What one server-sent event of an LLM stream says it used: the fields
/// present of an OpenAI final chunk's `usage` (`prompt_tokens`,
/// `completion_tokens`, `total_tokens`) or of Anthropic's `usage` in
/// `message_start` (under `message`) and `message_delta`
/// (`input_tokens` with the cache counts, `output_tokens`).
pub(super) fn llm_event_usage(data: &[u8]) -> Vec<(String, u32)> {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return Vec::new();
    };
    let Some(usage) = value
        .get("usage")
        .or_else(|| value.get("message").and_then(|m| m.get("usage")))
        .filter(|u| u.is_object())
    else {
        return Vec::new();
    };
    let field = |name: &str| usage.get(name).and_then(serde_json::Value::as_u64);
    let units = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    let mut out = Vec::new();
    let input = field("prompt_tokens").or_else(|| {
        field("input_tokens").map(|input| {
            ["cache_creation_input_tokens", "cache_read_input_tokens"]
                .into_iter()
                .filter_map(field)
                .fold(input, u64::saturating_add)
        })
    });
    if let Some(input) = input {
        out.push(("input_tokens".to_string(), units(input)));
    }
    if let Some(output) = field("completion_tokens").or_else(|| field("output_tokens")) {
        out.push(("output_tokens".to_string(), units(output)));
    }
    if let Some(total) = field("total_tokens") {
        out.push(("tokens".to_string(), units(total)));
    }
    out
}
