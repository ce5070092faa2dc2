//! [`TicketBody`]: a response body that holds its call's ticket until it
//! ends, fails or is dropped, and settles the usage its stream reports.

use core::fmt;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::sync::Arc;

use bytes::Buf;
use http_body::{Body, Frame, SizeHint};

use crate::admission::Ticket;
use crate::clock::{Clock, DefaultClock};
use crate::sleep::{DefaultSleeper, Sleeper};

/// Reads what one event's data says it used.
pub(crate) type EventUsage = dyn Fn(&[u8]) -> Vec<(String, u32)> + Send + Sync;

/// A longer line is not read for usage (its bytes still pass through), so
/// memory stays bounded.
const MAX_LINE: usize = 1 << 20;

pin_project_lite::pin_project! {
    /// A response body holding its call's
    /// [`Ticket`](crate::admission::Ticket), released when the body ends,
    /// fails or is dropped, not when the head arrives. Its frames are the
    /// inner body's, unchanged. When built to read usage, each `data:` line is
    /// handed to the reader; the largest count per quota name settles the
    /// ticket at the end. A body cut off by an error counts against the
    /// circuit and settles nothing.
    pub struct TicketBody<B, S = DefaultSleeper, C = DefaultClock>
    where
        S: Sleeper,
        C: Clock,
    {
        #[pin]
        inner: B,
        held: Option<Held<S, C>>,
    }
}

/// What a body holds for its call until it ends.
struct Held<S: Sleeper, C: Clock> {
    ticket: Ticket<S, C>,
    usage: Option<Arc<EventUsage>>,
    /// The event line being read, across frames.
    line: Vec<u8>,
    /// Whether the current line outgrew `MAX_LINE` (skipped to its end).
    skipping: bool,
    /// The most each quota name was reported to use.
    used: Vec<(String, u32)>,
}

impl<B, S: Sleeper, C: Clock> TicketBody<B, S, C> {
    /// `inner`, holding `ticket` until it ends (reading `usage` from its
    /// events), or holding nothing.
    pub(crate) fn new(
        inner: B,
        ticket: Option<Ticket<S, C>>,
        usage: Option<Arc<EventUsage>>,
    ) -> Self {
        TicketBody {
            inner,
            held: ticket.map(|ticket| Held {
                ticket,
                usage,
                line: Vec::new(),
                skipping: false,
                used: Vec::new(),
            }),
        }
    }

    /// Whether the body still holds its call's ticket.
    #[cfg(feature = "tower")]
    pub fn holds_ticket(&self) -> bool {
        self.held.is_some()
    }

    /// The inner body.
    #[cfg(feature = "tower")]
    pub fn get_ref(&self) -> &B {
        &self.inner
    }
}

impl<S: Sleeper, C: Clock> Held<S, C> {
    fn scan(&mut self, data: &[u8]) {
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

    /// Every chunk of a frame's data, without consuming it.
    fn scan_buf(&mut self, data: &impl Buf) {
        const SLICES: usize = 16;
        let mut slices = [std::io::IoSlice::new(&[]); SLICES];
        let n = data.chunks_vectored(&mut slices);
        let seen: usize = slices[..n].iter().map(|s| s.len()).sum();
        for slice in &slices[..n] {
            self.scan(slice);
        }
        if seen < data.remaining() {
            // More chunks than one look shows: the line they end is not read.
            self.skipping = true;
            self.line.clear();
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

    /// The body ended: the usage it reported settles the ticket, then released.
    fn finish(mut self) {
        // A last line with no newline.
        if !self.line.is_empty() && !self.skipping {
            self.event_line();
        }
        // Counts reported in parts add up to at least their total.
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
            self.ticket.settle(name, *units);
        }
    }
}

impl<B, S, C> Body for TicketBody<B, S, C>
where
    B: Body,
    S: Sleeper,
    C: Clock,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let mut this = self.project();
        let polled = this.inner.as_mut().poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(held), Some(data)) = (this.held.as_mut(), frame.data_ref())
                    && held.usage.is_some()
                {
                    held.scan_buf(data);
                }
                // A consumer may stop at `is_end_stream` (hyper does) and never poll
                // the `None`: the body has ended.
                if this.inner.is_end_stream()
                    && let Some(held) = this.held.take()
                {
                    held.finish();
                }
            }
            Poll::Ready(Some(Err(_))) => {
                // Cut off mid-stream: nothing to settle, a failure for the circuit.
                if let Some(held) = this.held.take() {
                    held.ticket.observe_error();
                }
            }
            Poll::Ready(None) => {
                if let Some(held) = this.held.take() {
                    held.finish();
                }
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B: fmt::Debug, S: Sleeper, C: Clock> fmt::Debug for TicketBody<B, S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TicketBody")
            .field("inner", &self.inner)
            .field("holds_ticket", &self.held.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::{Admission, CallSpec, CircuitBreaker};
    use crate::clock::ManualClock;
    use crate::headers::llm_event_usage;
    use crate::throttled::Status;
    use crate::Quota;
    use bytes::Bytes;
    use futures::FutureExt;
    use std::collections::VecDeque;

    /// A body that yields its frames in order: data, or an error.
    #[derive(Debug)]
    struct Frames(VecDeque<Result<&'static [u8], &'static str>>);

    impl Body for Frames {
        type Data = Bytes;
        type Error = &'static str;

        fn is_end_stream(&self) -> bool {
            self.0.is_empty()
        }

        fn size_hint(&self) -> SizeHint {
            let left = self.0.iter().flatten().map(|d| d.len() as u64).sum();
            SizeHint::with_exact(left)
        }

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, &'static str>>> {
            Poll::Ready(
                self.0
                    .pop_front()
                    .map(|f| f.map(|data| Frame::data(Bytes::from_static(data)))),
            )
        }
    }

    fn layer() -> Admission<ManualClock, ManualClock> {
        let clock = ManualClock::new();
        Admission::builder()
            .clock(clock.clone())
            .sleeper(clock)
            .resource(
                "tokens",
                Quota::per_minute(core::num::NonZeroU32::new(10_000).expect("non-zero")),
            )
            .fixed_rates()
            .default_quota(Quota::per_second(
                core::num::NonZeroU32::new(1_000).expect("non-zero"),
            ))
            .circuit_breaker(CircuitBreaker::new().consecutive_failures(1))
            .build()
    }

    fn read_all<B: Body + Unpin>(mut body: B) -> (usize, Option<B::Error>) {
        let (mut frames, mut cx) = (0, Context::from_waker(futures::task::noop_waker_ref()));
        loop {
            match Pin::new(&mut body).poll_frame(&mut cx) {
                Poll::Ready(Some(Ok(_))) => frames += 1,
                Poll::Ready(Some(Err(e))) => return (frames, Some(e)),
                Poll::Ready(None) => return (frames, None),
                Poll::Pending => unreachable!("the frames are all there"),
            }
        }
    }

    #[test]
    fn usage_split_across_frames_settles_and_a_cut_stream_opens_the_circuit() {
        let admission = layer();
        let spec = CallSpec::new("chat", "key").cost("tokens", 500);
        let admit = || admission.admit(&spec).now_or_never().expect("at once");
        // The usage event arrives in three frames, split mid-line and
        // mid-number; a line past 1 MiB before it is skipped, not read.
        let long: &'static [u8] = Box::leak(vec![b'x'; MAX_LINE + 1].into_boxed_slice());
        let frames = Frames(VecDeque::from([
            Ok(&b"data: {\"choices\":[]}\n\n"[..]),
            Ok(long),
            Ok(&b"\ndata: {\"usage\":{\"prompt_tokens\":7"[..]),
            Ok(&b"00,\"completion_tokens\":10"[..]),
            Ok(&b"5}}\r\n\ndata: [DONE]"[..]),
        ]));
        let body = TicketBody::new(
            frames,
            Some(admit().unwrap()),
            Some(Arc::new(llm_event_usage)),
        );
        assert_eq!(admission.stats().in_flight, 1);
        assert_eq!(admission.available("key", "tokens"), Some(9_500));
        assert_eq!(read_all(body), (5, None), "every frame passes through");
        assert_eq!(admission.stats().in_flight, 0);
        assert_eq!(admission.available("key", "tokens"), Some(10_000 - 805));

        // Cut off mid-stream: the estimate stands, the circuit counts it.
        let frames = Frames(VecDeque::from([Ok(&b"data: {}\n"[..]), Err("reset")]));
        let body = TicketBody::new(
            frames,
            Some(admit().unwrap()),
            Some(Arc::new(llm_event_usage)),
        );
        assert_eq!(read_all(body), (1, Some("reset")));
        assert_eq!(admission.stats().in_flight, 0);
        assert_eq!(
            admission.available("key", "tokens"),
            Some(10_000 - 805 - 500)
        );
        assert_eq!(admit().unwrap_err().status, Status::Unavailable);
    }

    /// A consumer that stops at `is_end_stream` still settles and releases.
    #[test]
    fn ticket_body_settles_only_on_ready_none_is_fixed() {
        let admission = layer();
        let spec = CallSpec::new("chat", "key").cost("tokens", 500);
        let ticket = admission.admit(&spec).now_or_never().expect("at once");
        let frames = Frames(VecDeque::from([Ok(
            &b"data: {\"usage\":{\"prompt_tokens\":700,\"completion_tokens\":105}}\n\n"[..],
        )]));
        let mut body = TicketBody::new(
            frames,
            Some(ticket.unwrap()),
            Some(Arc::new(llm_event_usage)),
        );
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        assert!(matches!(
            Pin::new(&mut body).poll_frame(&mut cx),
            Poll::Ready(Some(Ok(_)))
        ));
        assert!(body.is_end_stream(), "the consumer stops here");
        assert_eq!(admission.stats().in_flight, 0, "the slot came back");
        assert_eq!(admission.available("key", "tokens"), Some(10_000 - 805));
        drop(body);
    }

    /// A `MAX_LINE` line, a last line with no newline and usage in parts are read.
    #[test]
    fn the_longest_line_the_last_line_and_usage_in_parts_are_read() {
        let admission = layer();
        let spec = CallSpec::new("chat", "key").cost("tokens", 500);
        let admit = || admission.admit(&spec).now_or_never().expect("at once");
        // `data: {"message":{"usage":{...}}}` padded with JSON whitespace to
        // exactly MAX_LINE bytes, split in the middle of the padding.
        let head = br#"data: {"type":"message_start","message":{"usage":{"input_tokens":700,"output_tokens":1}}"#;
        let pad = MAX_LINE - head.len() - 1;
        let mut first = head.to_vec();
        first.extend(std::iter::repeat_n(b' ', pad / 2));
        let mut second = vec![b' '; pad - pad / 2];
        second.extend_from_slice(b"}\n\n");
        assert_eq!(
            first.len() + second.len() - 2,
            MAX_LINE,
            "the line, without its newline"
        );
        let delta = &br#"data: {"type":"message_delta","usage":{"output_tokens":105}}"#[..];
        let total = (first.len() + second.len() + delta.len()) as u64;
        let frames = Frames(VecDeque::from([
            Ok(&*Box::leak(first.into_boxed_slice())),
            Ok(&*Box::leak(second.into_boxed_slice())),
            Ok(delta),
        ]));
        let body = TicketBody::new(
            frames,
            Some(admit().unwrap()),
            Some(Arc::new(llm_event_usage)),
        );
        assert!(!body.is_end_stream());
        assert_eq!(body.size_hint().exact(), Some(total));
        assert!(format!("{body:?}").contains("holds_ticket: true"));
        #[cfg(feature = "tower")]
        assert!(body.holds_ticket());
        let mut body = body;
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        while let Poll::Ready(Some(frame)) = Pin::new(&mut body).poll_frame(&mut cx) {
            frame.unwrap();
        }
        assert!(body.is_end_stream());
        #[cfg(feature = "tower")]
        assert!(!body.holds_ticket());
        assert!(format!("{body:?}").contains("holds_ticket: false"));
        // 700 in, 105 out: 805, not the 701 of the first event.
        assert_eq!(admission.available("key", "tokens"), Some(10_000 - 805));
    }
}
