//! `Runner`: executes one model turn's calls through [`Admission`] and
//! returns their results in input order.
//!
//! * Reads with the same `(tool, canonical args)` share one execution
//!   ([`SingleFlight`]) and, within the cache TTL, one result; writes are
//!   never coalesced or cached. Which calls are reads is the caller's
//!   decision ([`Kind`]).
//! * A 429 is fed back to the admission layer (every call on that key is
//!   held back), then the call is admitted again: the wait is slept inline
//!   while it is short, and surfaced as `rate_limited` when it is not.
//! * Transient failures (5xx, transport errors) are retried with jittered
//!   backoff charged against the call's deadline; a retry that would pass
//!   the deadline is not slept but surfaced as `timed_out`.
//! * When the server lets a call through, it costs exactly one request.

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::Poll;
use core::time::Duration;
use std::sync::Arc;

use crate::backoff::{Backoff, Deadline, Decision, Jitter, RetryPolicy, SurfaceStatus, Surfaced};
use crate::clock::Clock;
use crate::headers::ServerHint;
use crate::single_flight::{FlightError, Provenance, SingleFlight};
use crate::sleep::Sleeper;

use super::{Admission, CallSpec, Kind, Status, Throttled};

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
    /// The server kept failing (or the transport did) and retries ran out.
    Failed {
        /// The last status (0 for a transport error).
        status: u16,
        /// What went wrong.
        error: String,
        /// Requests sent.
        attempts: u32,
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

/// Why a led execution ended without a value (shared with followers).
#[derive(Debug)]
enum Failure {
    Throttled(Throttled),
    Failed {
        status: u16,
        error: String,
        attempts: u32,
    },
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
        let clock = admission.inner.clock.clone();
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
        let Some(key) = key else {
            return match self.attempts(&call).await {
                Ok((value, attempts)) => CallResult::Done {
                    value,
                    provenance: Provenance::Leader,
                    attempts,
                },
                Err(f) => f.into_result(),
            };
        };
        let attempts_cell = std::sync::atomic::AtomicU32::new(0);
        let led = self
            .flights
            .try_run(key, || async {
                let (value, attempts) = self.attempts(&call).await?;
                attempts_cell.store(attempts, std::sync::atomic::Ordering::Relaxed);
                Ok(value)
            })
            .await;
        match led {
            Ok((value, provenance)) => CallResult::Done {
                value,
                provenance,
                attempts: if provenance == Provenance::Leader {
                    attempts_cell.load(std::sync::atomic::Ordering::Relaxed)
                } else {
                    0
                },
            },
            Err(FlightError::Failed(f)) => f.as_ref().clone_result(),
            Err(_) => CallResult::Failed {
                status: 0,
                error: "the identical call this one joined panicked".into(),
                attempts: 0,
            },
        }
    }

    /// Admits and sends one call until it succeeds, is refused, or runs out
    /// of retries or deadline.
    async fn attempts(&self, call: &Call<V>) -> Result<(V, u32), Failure> {
        let clock = self.admission.inner.clock.clone();
        let mut deadline = Deadline::after(clock, call.spec.deadline);
        let mut policy = self.retry.lock().fork();
        let mut sent = 0u32;
        loop {
            let spec = call.spec.clone().deadline(deadline.remaining());
            let ticket = self
                .admission
                .admit(&spec)
                .await
                .map_err(Failure::Throttled)?;
            sent += 1;
            let reply = (call.make)().await;
            let (status, hint, error) = match reply {
                Ok(r) if r.is_success() => {
                    ticket.observe(r.status, &r.hint);
                    return Ok((r.value, sent));
                }
                Ok(r) => {
                    ticket.observe(r.status, &r.hint);
                    self.admission.sync_shared().await;
                    let error = format!("server answered {}", r.status);
                    (r.status, r.hint, error)
                }
                Err(e) => (0, ServerHint::default(), e),
            };
            drop(ticket);
            let retryable = status == 0 || status == 429 || status == 408 || status >= 500;
            if !retryable || sent > self.max_retries {
                return Err(Failure::Failed {
                    status,
                    error,
                    attempts: sent,
                });
            }
            if status == 429 {
                // The hold is in the credential's bucket now (observe):
                // the next admit waits for it, or surfaces it.
                continue;
            }
            match policy.decide(&hint, &mut deadline) {
                Decision::Retry { after } => {
                    #[cfg(feature = "tracing")]
                    tracing::event!(
                        tracing::Level::DEBUG,
                        tool = %call.spec.tool,
                        status,
                        attempt = sent,
                        wait_ms = after.as_millis() as u64,
                        "backpressure: retried"
                    );
                    self.admission.inner.sleeper.sleep(after).await
                }
                Decision::Surface(s) => return Err(Failure::Throttled(surfaced(s))),
                _ => {
                    return Err(Failure::Failed {
                        status,
                        error,
                        attempts: sent,
                    })
                }
            }
        }
    }
}

impl Failure {
    fn into_result<V>(self) -> CallResult<V> {
        match self {
            Failure::Throttled(t) => CallResult::Throttled(t),
            Failure::Failed {
                status,
                error,
                attempts,
            } => CallResult::Failed {
                status,
                error,
                attempts,
            },
        }
    }

    fn clone_result<V>(&self) -> CallResult<V> {
        match self {
            Failure::Throttled(t) => CallResult::Throttled(t.clone()),
            Failure::Failed { status, error, .. } => CallResult::Failed {
                status: *status,
                error: error.clone(),
                attempts: 0,
            },
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Throttled(t) => t.fmt(f),
            Failure::Failed { error, .. } => f.write_str(error),
        }
    }
}

fn surfaced(s: Surfaced) -> Throttled {
    let status = match s.status {
        SurfaceStatus::RateLimited => Status::RateLimited,
        _ => Status::TimedOut,
    };
    let t = Throttled::new(status, s.scope.unwrap_or_else(|| "server".into()), s.hint);
    match s.retry_after {
        Some(d) => t.with_retry_after(d),
        None => t,
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
