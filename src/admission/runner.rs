//! `Runner`: executes one model turn's calls through [`Admission`] and
//! returns their results in input order, one [`CallResult`] per call.
//!
//! * Reads with the same `(tool, canonical args)` share one execution
//!   ([`SingleFlight`]) and, within the cache TTL, one result; writes are
//!   never coalesced or cached. Which calls are reads is the caller's
//!   decision ([`Kind`]).
//! * Every attempt is admitted first ([`Admission::admit`]), so retries
//!   pay the same slots, rate and deadline as first attempts.
//! * A panic in a call is contained in that call's result
//!   ([`CallResult::Panicked`]); the turn's other calls complete.
//!
//! What the runner does with each reply (retries: 3 by default, see
//! [`Runner::retries`]; `attempts` counts the requests the call sent):
//!
//! | reply | fed back | retried? | ends as |
//! | --- | --- | --- | --- |
//! | 2xx | `observe` (`remaining: 0` waits for the reset) | no | `Done` |
//! | 429, or 503 with `Retry-After` | the credential (or server scope) is held for `Retry-After` (1 s if absent) | yes: re-admitted behind the hold; slept inline while it fits the inline wait and the deadline | `Throttled { rate_limited }` when the hold does not fit or the retries run out, never `Failed` |
//! | 408, other 5xx | `observe` | yes, after jittered backoff (100 ms to 5 s) charged to the deadline | `Failed` with the last status when retries, deadline or admission run out |
//! | transport error | nothing (not a rate limit) | yes, as 5xx | `Failed { status: 0, error }`, never `rate_limited` |
//! | other 4xx | `observe` | no | `Failed` |
//! | refused by admission | | no | `Throttled` with the refusal's status |
//! | panic | | no | `Panicked` |
//!
//! A retry refused by admission after a transport error or a 5xx ends as
//! that `Failed` (the refusal is named as the reason it was not retried);
//! after a 429 it ends as the refusal, `Throttled`.

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::Poll;
use core::time::Duration;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::Arc;

use crate::backoff::{Backoff, Deadline, Decision, Jitter, RetryPolicy};
use crate::clock::Clock;
use crate::headers::ServerHint;
use crate::single_flight::{FlightError, Provenance, SingleFlight};
use crate::sleep::Sleeper;

use super::{Admission, CallSpec, Human, Kind, Status, Throttled};

/// What one attempt of a call got back from the server.
///
/// # Examples
///
/// ```
/// use backpressure::{Reply, ServerHint};
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
}

impl<V> Reply<V> {
    /// A reply with no limit headers.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Reply;
    /// assert_eq!(Reply::new(204, ()).status, 204);
    /// ```
    pub fn new(status: u16, value: V) -> Self {
        Self {
            status,
            hint: ServerHint::default(),
            value,
        }
    }

    /// Attaches the limit headers.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Reply, ServerHint};
    /// use std::time::{Duration, SystemTime};
    /// let hint = ServerHint::from_headers([("retry-after", "2")], SystemTime::now());
    /// let reply = Reply::new(429, ()).with_hint(hint);
    /// assert_eq!(reply.hint.retry_after, Some(Duration::from_secs(2)));
    /// ```
    pub fn with_hint(mut self, hint: ServerHint) -> Self {
        self.hint = hint;
        self
    }

    /// 2xx.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::Reply;
    /// assert!(Reply::new(201, ()).is_success());
    /// assert!(!Reply::new(503, ()).is_success());
    /// ```
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// The boxed future of one attempt: a reply, or a transport error.
pub type AttemptFuture<V> = Pin<Box<dyn Future<Output = Result<Reply<V>, String>> + Send>>;

/// One logical call of a turn: what to admit, how to coalesce it, and how
/// to make one attempt (called once per attempt).
///
/// # Examples
///
/// ```
/// use backpressure::{Call, CallSpec, Reply};
/// let call = Call::new(CallSpec::new("search_tickets", "key"), || async {
///     Ok(Reply::new(200, "[]".to_string()))
/// })
/// .coalesce_key("q=refund");
/// # let _ = call;
/// ```
pub struct Call<V> {
    spec: CallSpec,
    key: Option<String>,
    make: Box<dyn Fn() -> AttemptFuture<V> + Send + Sync>,
}

impl<V> Call<V> {
    /// A call; `make` starts one attempt each time it is called.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Call, CallSpec, Reply};
    /// let call = Call::new(CallSpec::new("get_usage", "key"), || async { Ok(Reply::new(200, 42u64)) });
    /// # let _ = call;
    /// ```
    pub fn new<F, Fut>(spec: CallSpec, make: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Reply<V>, String>> + Send + 'static,
    {
        Self {
            spec,
            key: None,
            make: Box::new(move || Box::pin(make())),
        }
    }

    /// The canonical arguments of a read: reads of one tool with equal keys
    /// share one execution and, within the TTL, one cached result. Ignored
    /// for writes.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Call, CallSpec, Reply};
    /// let call = Call::new(CallSpec::new("search", "key"), || async { Ok(Reply::new(200, ())) })
    ///     .coalesce_key("q=refund&page=1");
    /// # let _ = call;
    /// ```
    pub fn coalesce_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }
}

impl<V> fmt::Debug for Call<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Call")
            .field("spec", &self.spec)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// The result of one logical call.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallResult<V> {
    /// The server answered with success.
    Done {
        /// The value.
        value: V,
        /// Whether this call ran, joined an identical one, or was served
        /// from the turn's cache.
        provenance: Provenance,
        /// Requests this call itself sent (0 when joined or cached).
        attempts: u32,
    },
    /// Not now, and why: plan with it, do not retry blindly.
    Throttled(Throttled),
    /// The call failed for a reason that is not about capacity: a 4xx
    /// other than 408/429, a 5xx or transport error that outlasted its
    /// retries, or a transport error whose retry was not admitted. Never a
    /// 429: a call whose last answer was a 429 ends as [`Throttled`].
    Failed {
        /// The last status (0 for a transport error).
        status: u16,
        /// What went wrong.
        error: String,
        /// Requests this call itself sent (0 when it joined an identical
        /// call that failed).
        attempts: u32,
    },
    /// The call's attempt (or the closure making it) panicked. The panic is
    /// contained: the turn's other calls complete, and the call's slots
    /// were released.
    Panicked {
        /// The panic's message, if it was a string.
        message: String,
    },
}

impl<V> CallResult<V> {
    /// The value, if the call succeeded.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{CallResult, Provenance};
    /// let r = CallResult::Done { value: 7, provenance: Provenance::Leader, attempts: 1 };
    /// assert_eq!(r.value(), Some(&7));
    /// ```
    pub fn value(&self) -> Option<&V> {
        match self {
            CallResult::Done { value, .. } => Some(value),
            _ => None,
        }
    }

    /// The structured refusal, if any.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{CallResult, Status, Throttled};
    /// let r: CallResult<()> = CallResult::Throttled(Throttled::new(Status::Shed, "queue", "busy"));
    /// assert_eq!(r.throttled().unwrap().status, Status::Shed);
    /// ```
    pub fn throttled(&self) -> Option<&Throttled> {
        match self {
            CallResult::Throttled(t) => Some(t),
            _ => None,
        }
    }
}

/// Under the `serde` feature every result serializes as one JSON object
/// with a `status` field a model can branch on:
///
/// | variant | `status` | other fields |
/// | --- | --- | --- |
/// | `Done` | `"done"` | `value`, `provenance` (`leader`/`joined`/`cached`), `attempts` |
/// | `Throttled` | the [`Status`] (`rate_limited`, `shed`, ...) | `scope`, `retry_after_ms`, `hint` (as [`Throttled`]) |
/// | `Failed` | `"failed"` | `http_status` (0: transport), `error`, `attempts` |
/// | `Panicked` | `"panicked"` | `message` |
#[cfg(feature = "serde")]
impl<V: serde::Serialize> serde::Serialize for CallResult<V> {
    fn serialize<Ser: serde::Serializer>(&self, s: Ser) -> Result<Ser::Ok, Ser::Error> {
        use serde::ser::SerializeStruct;
        match self {
            CallResult::Done {
                value,
                provenance,
                attempts,
            } => {
                let mut st = s.serialize_struct("CallResult", 4)?;
                st.serialize_field("status", "done")?;
                st.serialize_field("value", value)?;
                st.serialize_field("provenance", provenance)?;
                st.serialize_field("attempts", attempts)?;
                st.end()
            }
            CallResult::Throttled(t) => t.serialize(s),
            CallResult::Failed {
                status,
                error,
                attempts,
            } => {
                let mut st = s.serialize_struct("CallResult", 4)?;
                st.serialize_field("status", "failed")?;
                st.serialize_field("http_status", status)?;
                st.serialize_field("error", error)?;
                st.serialize_field("attempts", attempts)?;
                st.end()
            }
            CallResult::Panicked { message } => {
                let mut st = s.serialize_struct("CallResult", 2)?;
                st.serialize_field("status", "panicked")?;
                st.serialize_field("message", message)?;
                st.end()
            }
        }
    }
}

/// Why a led execution ended without a value (shared with followers).
#[derive(Debug)]
enum Failure {
    Throttled(Throttled),
    /// The caller's own request count is added by `to_result`.
    Failed {
        status: u16,
        error: String,
    },
    Panicked(String),
}

/// What the previous attempt of a call got, for when its retry is refused.
struct LastAttempt {
    status: u16,
    error: String,
}

/// Runs a turn's calls through an [`Admission`].
///
/// # Examples
///
/// ```
/// use backpressure::{Admission, Call, CallSpec, Reply, Runner};
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// # futures::executor::block_on(async {
/// let runner: Runner<String> = Runner::new(Admission::builder().build(), Duration::from_secs(3));
/// let sent = Arc::new(AtomicUsize::new(0));
/// let search = |sent: Arc<AtomicUsize>| {
///     Call::new(CallSpec::new("search_tickets", "key"), move || {
///         let sent = sent.clone();
///         async move {
///             sent.fetch_add(1, Ordering::SeqCst);
///             Ok(Reply::new(200, "[#1]".to_string()))
///         }
///     })
///     .coalesce_key("q=refund")
/// };
/// let results = runner.execute(vec![search(sent.clone()), search(sent.clone())]).await;
/// assert_eq!(sent.load(Ordering::SeqCst), 1); // one request for two identical reads
/// assert!(results.iter().all(|r| r.value().map(String::as_str) == Some("[#1]")));
/// # });
/// ```
pub struct Runner<V, S = crate::sleep::ThreadSleeper, C: Clock = crate::clock::DefaultClock> {
    admission: Admission<S, C>,
    flights: SingleFlight<(String, String), V, Failure, C>,
    retry: Arc<parking_lot::Mutex<RetryPolicy>>,
    max_retries: u32,
}

impl<V, S, C> Runner<V, S, C>
where
    V: Clone + Send + Sync + 'static,
    S: Sleeper,
    C: Clock + Clone,
{
    /// A runner over `admission` whose read cache keeps results for
    /// `cache_ttl` (zero disables the cache; coalescing of reads in flight
    /// stays on). Transient failures are retried up to 3 times with full
    /// jitter from 100 ms to 5 s.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Admission, Runner};
    /// use std::time::Duration;
    /// let runner: Runner<String> = Runner::new(Admission::builder().build(), Duration::from_secs(3));
    /// # let _ = runner;
    /// ```
    pub fn new(admission: Admission<S, C>, cache_ttl: Duration) -> Self {
        let clock = admission.clock().clone();
        let mut flights = SingleFlight::builder().clock(clock);
        if !cache_ttl.is_zero() {
            flights = flights.cache(cache_ttl, 4096);
        }
        let backoff =
            Backoff::new(Duration::from_millis(100), Duration::from_secs(5)).jitter(Jitter::Full);
        Self {
            admission,
            flights: flights.build(),
            retry: Arc::new(parking_lot::Mutex::new(RetryPolicy::new(backoff))),
            max_retries: 3,
        }
    }

    /// Sets the backoff of transient-failure retries (its seed makes runs
    /// reproducible) and how many retries a call gets.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Admission, Backoff, Runner};
    /// use std::time::Duration;
    /// let runner: Runner<String> = Runner::new(Admission::builder().build(), Duration::ZERO)
    ///     .retries(Backoff::new(Duration::from_millis(50), Duration::from_secs(1)).seed(7), 2);
    /// # let _ = runner;
    /// ```
    pub fn retries(self, backoff: Backoff, max_retries: u32) -> Self {
        *self.retry.lock() = RetryPolicy::new(backoff).max_retries(max_retries);
        Self {
            max_retries,
            ..self
        }
    }

    /// Drops the turn's cached reads (call it at the end of a turn).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Admission, Runner};
    /// use std::time::Duration;
    /// let runner: Runner<String> = Runner::new(Admission::builder().build(), Duration::from_secs(3));
    /// runner.clear_cache(); // end of the turn
    /// ```
    pub fn clear_cache(&self) {
        self.flights.clear();
    }

    /// The admission layer the runner uses.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Admission, Runner};
    /// use std::time::Duration;
    /// let runner: Runner<String> = Runner::new(Admission::builder().build(), Duration::ZERO);
    /// assert_eq!(runner.admission().waiting(), 0);
    /// ```
    pub fn admission(&self) -> &Admission<S, C> {
        &self.admission
    }

    /// Runs every call concurrently and returns the results in input order.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Admission, Call, CallSpec, Reply, Runner};
    /// use std::time::Duration;
    /// # futures::executor::block_on(async {
    /// let runner: Runner<u32> = Runner::new(Admission::builder().build(), Duration::ZERO);
    /// let calls = (0..3)
    ///     .map(|i| Call::new(CallSpec::new("t", "k"), move || async move { Ok(Reply::new(200, i)) }))
    ///     .collect();
    /// let results = runner.execute(calls).await;
    /// assert_eq!(results.iter().map(|r| *r.value().unwrap()).collect::<Vec<_>>(), [0, 1, 2]);
    /// # });
    /// ```
    pub async fn execute(&self, calls: Vec<Call<V>>) -> Vec<CallResult<V>> {
        let futures: Vec<_> = calls.into_iter().map(|c| Box::pin(self.one(c))).collect();
        join_all(futures).await
    }

    /// Runs one call.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::{Admission, Call, CallSpec, Reply, Runner};
    /// use std::time::Duration;
    /// # futures::executor::block_on(async {
    /// let runner: Runner<&str> = Runner::new(Admission::builder().build(), Duration::ZERO);
    /// let r = runner.one(Call::new(CallSpec::new("t", "k"), || async { Ok(Reply::new(200, "ok")) })).await;
    /// assert_eq!(r.value(), Some(&"ok"));
    /// # });
    /// ```
    pub async fn one(&self, call: Call<V>) -> CallResult<V> {
        let key = match (&call.key, call.spec.kind) {
            (Some(k), Kind::Read) => Some((call.spec.tool.clone(), k.clone())),
            _ => None,
        };
        // Requests this caller sent itself (it led, or took over a flight).
        let sent = AtomicU32::new(0);
        let Some(key) = key else {
            return match self.contained(&call, &sent).await {
                Ok(value) => CallResult::Done {
                    value,
                    provenance: Provenance::Leader,
                    attempts: sent.load(Relaxed),
                },
                Err(f) => f.to_result(sent.load(Relaxed)),
            };
        };
        let led = self
            .flights
            .try_run(key, || self.contained(&call, &sent))
            .await;
        // Relaxed: written by this task's own future, read after it ended.
        let attempts = sent.load(Relaxed);
        match led {
            Ok((value, provenance)) => CallResult::Done {
                value,
                provenance,
                attempts: if provenance == Provenance::Leader {
                    attempts
                } else {
                    0
                },
            },
            Err(FlightError::Failed(f)) => f.to_result(attempts),
            // `contained` catches the closure's panics; a flight can only
            // report one if the runner itself panicked.
            Err(e) => CallResult::Panicked {
                message: e.to_string(),
            },
        }
    }

    /// [`attempts`](Self::attempts), with a panic turned into
    /// [`Failure::Panicked`]: the attempt's future (holding the ticket) is
    /// dropped, so its slots are released, and the other calls go on.
    async fn contained(&self, call: &Call<V>, sent: &AtomicU32) -> Result<V, Failure> {
        let mut attempts = Box::pin(self.attempts(call, sent));
        core::future::poll_fn(|cx| {
            match std::panic::catch_unwind(AssertUnwindSafe(|| attempts.as_mut().poll(cx))) {
                Ok(p) => p,
                Err(payload) => Poll::Ready(Err(Failure::Panicked(panic_message(&*payload)))),
            }
        })
        .await
    }

    /// Admits and sends one call until it succeeds, is refused, or runs out
    /// of retries or deadline. `sent` counts the requests sent.
    async fn attempts(&self, call: &Call<V>, sent: &AtomicU32) -> Result<V, Failure> {
        let mut deadline = Deadline::after(self.admission.clock().clone(), call.spec.deadline);
        let mut policy = self.retry.lock().fork();
        let mut last: Option<LastAttempt> = None;
        loop {
            let spec = call.spec.clone().deadline(deadline.remaining());
            let ticket = match self.admission.admit(&spec).await {
                Ok(t) => t,
                Err(refused) => return Err(refused_retry(refused, last)),
            };
            // Relaxed: a count read by this call's own task afterwards.
            let n = sent.fetch_add(1, Relaxed) + 1;
            let reply = (call.make)().await;
            let (status, hint, error) = match reply {
                Ok(r) if r.is_success() => {
                    ticket.observe(r.status, &r.hint);
                    return Ok(r.value);
                }
                Ok(r) => {
                    let held = ticket.observe(r.status, &r.hint);
                    self.admission.sync_shared().await;
                    let capacity = is_capacity(r.status, &r.hint);
                    if capacity && n > self.max_retries {
                        // Out of retries, and the server's last word was
                        // "not now": that is a rate limit, never a failure.
                        return Err(Failure::Throttled(still_throttled(
                            r.status, &r.hint, held, n,
                        )));
                    }
                    (r.status, r.hint, format!("server answered {}", r.status))
                }
                Err(e) => (0, ServerHint::default(), e),
            };
            drop(ticket);
            if is_capacity(status, &hint) {
                // The hold is in the credential's bucket now (observe): the
                // next admit waits for it, or surfaces it as rate_limited.
                last = Some(LastAttempt { status, error });
                continue;
            }
            let retryable = status == 0 || status == 408 || status >= 500;
            if !retryable || n > self.max_retries {
                return Err(Failure::Failed { status, error });
            }
            match policy.decide(&hint, &mut deadline) {
                Decision::Retry { after } => {
                    #[cfg(feature = "tracing")]
                    tracing::event!(
                        tracing::Level::DEBUG,
                        tool = %call.spec.tool,
                        status,
                        attempt = n,
                        wait_ms = after.as_millis() as u64,
                        "backpressure: retried"
                    );
                    if !self.admission.sleep_unless_closed(after).await {
                        return Err(Failure::Failed {
                            status,
                            error: format!("{error}; not retried: the admission layer closed"),
                        });
                    }
                    last = Some(LastAttempt { status, error });
                }
                // The error was not about capacity: report it as it was,
                // saying why it was not retried (a transport error is never
                // turned into a rate limit).
                Decision::Surface(s) => {
                    return Err(Failure::Failed {
                        status,
                        error: format!("{error}; not retried: {}", s.hint),
                    })
                }
                _ => return Err(Failure::Failed { status, error }),
            }
        }
    }
}

/// A 429, or a 503 that says when to come back: the server's capacity,
/// not a fault.
fn is_capacity(status: u16, hint: &ServerHint) -> bool {
    status == 429 || (status == 503 && hint.retry_after.is_some())
}

/// The call's last answer was "not now" and its retries are spent.
fn still_throttled(status: u16, hint: &ServerHint, held: Option<Duration>, sent: u32) -> Throttled {
    let scope = hint
        .scope
        .as_ref()
        .map_or_else(|| "api_key".to_string(), |s| format!("server:{s}"));
    let after = held
        .or_else(|| hint.wait())
        .unwrap_or(Duration::from_secs(1));
    Throttled::new(
        Status::RateLimited,
        scope,
        format!(
            "the server still answered {status} after {sent} requests; retry after {}",
            Human(after)
        ),
    )
    .with_retry_after(after)
}

/// A retry refused by admission ends the call with what it means: after a
/// 429 the refusal is the rate limit itself; after a transport error or a
/// 5xx it is the original failure (the server is not known to be
/// throttling), with the refusal as the reason it was not retried.
fn refused_retry(refused: Throttled, last: Option<LastAttempt>) -> Failure {
    match last {
        Some(l) if l.status != 429 && l.status != 503 && refused.status != Status::Closed => {
            Failure::Failed {
                status: l.status,
                error: format!("{}; not retried: {}", l.error, refused.hint),
            }
        }
        _ => Failure::Throttled(refused),
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "the call panicked with a non-string payload".to_string()
    }
}

impl Failure {
    /// The result for a caller that sent `attempts` requests itself.
    fn to_result<V>(&self, attempts: u32) -> CallResult<V> {
        match self {
            Failure::Throttled(t) => CallResult::Throttled(t.clone()),
            Failure::Failed { status, error, .. } => CallResult::Failed {
                status: *status,
                error: error.clone(),
                attempts,
            },
            Failure::Panicked(message) => CallResult::Panicked {
                message: message.clone(),
            },
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Throttled(t) => t.fmt(f),
            Failure::Failed { error, .. } => f.write_str(error),
            Failure::Panicked(m) => write!(f, "the call panicked: {m}"),
        }
    }
}

impl<V, S, C: Clock> fmt::Debug for Runner<V, S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runner")
            .field("admission", &self.admission)
            .field("max_retries", &self.max_retries)
            .finish_non_exhaustive()
    }
}

/// Polls every future to completion; outputs in input order.
async fn join_all<F: Future + Unpin>(mut futures: Vec<F>) -> Vec<F::Output> {
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    core::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, out) in futures.iter_mut().zip(outputs.iter_mut()) {
            if out.is_none() {
                match Pin::new(f).poll(cx) {
                    Poll::Ready(v) => *out = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs
        .into_iter()
        .map(|o| o.expect("every future completed"))
        .collect()
}
