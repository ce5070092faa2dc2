//! [`Call`]: one logical call of a turn, and [`Reply`], what one of its
//! attempts got back.

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::borrow::Cow;

use crate::headers::ServerHint;

use super::super::CallSpec;
#[cfg(doc)]
use super::CallResult;
#[cfg(doc)]
use crate::failure::CallFailure;

/// What one attempt of a call got back from the server.
///
/// # Examples
///
/// ```
/// use backpressure::admission::Reply;
/// use backpressure::headers::ServerHint;
/// let ok = Reply::new(200, "body");
/// assert!(ok.is_success());
/// let throttled = Reply::new(429, ()).with_hint(ServerHint::default());
/// assert!(!throttled.is_success());
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Reply<V> {
    /// The HTTP status (or an equivalent code).
    pub status: u16,
    /// What the response's headers said about limits.
    pub hint: ServerHint,
    /// The body or parsed value.
    pub value: V,
    /// What the call used of each weighted quota, as the reply reported it.
    /// [`Runner`](super::Runner) settles each entry against the estimate
    /// ([`Ticket::settle`](crate::admission::Ticket::settle)), whatever the status.
    pub usage: Vec<(Cow<'static, str>, u32)>,
}

impl<V> Reply<V> {
    /// A reply with no limit headers.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::Reply;
    /// assert_eq!(Reply::new(204, ()).status, 204);
    /// ```
    pub fn new(status: u16, value: V) -> Self {
        Self {
            status,
            hint: ServerHint::default(),
            value,
            usage: Vec::new(),
        }
    }

    /// Records what the call used of the weighted quota `name`; a second
    /// entry for the same name replaces the first.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Admission, Call, CallSpec, Reply, Runner};
    /// use backpressure::{ManualClock, Quota};
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    ///
    /// # futures::executor::block_on(async {
    /// let clock = ManualClock::new();
    /// let admission = Admission::builder()
    ///     .clock(clock.clone())
    ///     .sleeper(clock.clone())
    ///     .resource("tokens", Quota::per_minute(NonZeroU32::new(10_000).unwrap()))
    ///     .build();
    /// let runner: Runner<&str, String, _, _> = Runner::new(admission.clone(), Duration::from_secs(5));
    /// // Estimated 4,000 tokens; the reply says 1,000 were used.
    /// let call = Call::new(CallSpec::new("complete", "key").cost("tokens", 4_000), || async {
    ///     Ok(Reply::new(200, "done").used("tokens", 1_000))
    /// });
    /// runner.execute(vec![call]).await;
    /// assert_eq!(admission.available("key", "tokens"), Some(9_000));
    /// # });
    /// ```
    pub fn used(mut self, name: impl Into<Cow<'static, str>>, units: u32) -> Self {
        super::super::spec::set_units(&mut self.usage, name.into(), units);
        self
    }

    /// Attaches the limit headers.
    pub fn with_hint(mut self, hint: ServerHint) -> Self {
        self.hint = hint;
        self
    }

    /// 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// A call's attempts, made in place: the closure and the running
/// attempt's future live in one box the `Call` allocates once, so an
/// attempt allocates nothing.
pub(crate) trait Attempts<V, E>: Send {
    /// Drops the running attempt, if any, and starts another.
    fn start(self: Pin<&mut Self>);
    /// Polls the attempt [`start`](Self::start) started.
    fn poll_attempt(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<Reply<V>, E>>;
}

pin_project_lite::pin_project! {
    struct Slot<F, Fut> {
        make: F,
        #[pin]
        running: Option<Fut>,
    }
}

impl<V, E, F, Fut> Attempts<V, E> for Slot<F, Fut>
where
    F: Fn() -> Fut + Send,
    Fut: Future<Output = Result<Reply<V>, E>> + Send,
{
    fn start(self: Pin<&mut Self>) {
        let mut this = self.project();
        let attempt = (this.make)();
        this.running.set(Some(attempt));
    }

    fn poll_attempt(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<Reply<V>, E>> {
        let mut this = self.project();
        let Some(running) = this.running.as_mut().as_pin_mut() else {
            unreachable!("polled before start");
        };
        let out = core::task::ready!(running.poll(cx));
        this.running.set(None);
        Poll::Ready(out)
    }
}

/// One logical call of a turn: what to admit, how to coalesce it, and how
/// to make one attempt (called once per attempt).
///
/// An attempt returns `Ok(Reply)` whenever the server answered (whatever
/// the status) and `Err(E)` only when it did not: `E` is the caller's own
/// transport error (`String` by default), handed back in
/// [`CallResult::Failed`] as [`CallFailure::Transport`].
///
/// # Examples
///
/// ```
/// use backpressure::admission::{Call, CallSpec, Reply};
/// let call = Call::new(CallSpec::new("search_tickets", "key"), || async {
///     Ok::<_, std::io::Error>(Reply::new(200, "[]".to_string()))
/// })
/// .coalesce_key("q=refund");
/// # let _ = call;
/// ```
pub struct Call<V, E = String> {
    pub(super) spec: CallSpec,
    pub(super) key: Option<String>,
    pub(super) attempts: Pin<Box<dyn Attempts<V, E>>>,
}

impl<V, E> Call<V, E> {
    /// A call; `make` starts one attempt each time it is called.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Call, CallSpec, Reply};
    // `E`, the transport error, is `String` unless stated otherwise.
    /// let call: Call<u64> = Call::new(CallSpec::new("get_usage", "key"), || async { Ok(Reply::new(200, 42u64)) });
    /// # let _ = call;
    /// ```
    pub fn new<F, Fut>(spec: CallSpec, make: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Reply<V>, E>> + Send + 'static,
    {
        Self {
            spec,
            key: None,
            attempts: Box::pin(Slot {
                make,
                running: None,
            }),
        }
    }

    /// The canonical arguments of a read: reads of one tool with equal keys
    /// share one execution and, within the TTL, one cached result. Ignored
    /// for writes.
    pub fn coalesce_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }
}

impl<V, E> fmt::Debug for Call<V, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Call")
            .field("spec", &self.spec)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}
