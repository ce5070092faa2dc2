//! [`AdmissionLayer`]: every request admitted through a shared
//! [`Admission`], its ticket held for the life of the response future.

mod exchange;
mod hooks;
#[cfg(feature = "http")]
mod outcome;
mod release;

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use core::time::Duration;
use std::sync::Arc;

use ::tower::{Layer, Service};
use parking_lot::Mutex;

use super::BoxError;
use crate::admission::attempt::reads::Joined;
use crate::admission::identity::ReadKey;
use crate::admission::Admission;
use crate::clock::{Clock, DefaultClock};
use crate::retry::RetryPolicy;
use crate::sleep::{DefaultSleeper, Sleeper};

#[cfg(feature = "http")]
pub(crate) use exchange::Unanswered;
#[cfg(feature = "http")]
use hooks::{HttpSpec, ObserveHttp, RefusalResponses};
use hooks::{MakeSpec, Observe, ObserveOk, UsageFrom};
#[cfg(feature = "http")]
use release::AtBodyEnd;
use release::{AtHead, Release};

/// Admits each request through one shared [`Admission`] (its concurrency
/// pools, rate limits per credential, budgets and the holds servers
/// asked for), holds the [`Ticket`](crate::admission::Ticket) while the inner call
/// runs, and feeds the response back to it.
///
/// * **Spec.** A closure maps each request to its
///   [`CallSpec`](crate::admission::CallSpec): tool, credential, kind, costs.
/// * **Deadline** (how long `admit` may wait): a request's own
///   `RequestDeadline` (with `AdmissionLayer::http`, feature `http`), else
///   the layer's [`deadline`](Self::deadline), else the spec's (30 s). A
///   rate wait longer than the admission's inline wait is refused at once.
/// * **Readiness** is the inner service's (the spec is only known in
///   `call`). `call` moves the ready service into the response future,
///   leaving a fresh clone behind (so services must be `Clone`), and calls
///   it the instant the ticket is granted. A retry polls it ready again.
/// * **One attempt loop**, the one `Runner` and the reqwest middleware run:
///   each attempt is admitted, sent (a clone of the request, so
///   `Req: Clone`), observed (by default any `Ok` is a 200; `ObserveHttp`
///   with `AdmissionLayer::http` reads the status and limit headers; or
///   [`observe_with`](Self::observe_with)), its usage settled, and the
///   [`retry_policy`](Self::retry_policy) decides, all within the one
///   deadline. The ticket covers the call until the response head, or,
///   with [`hold_bodies`](Self::hold_bodies), until the body ends.
/// * **Refusal.** A [`Throttled`](crate::Throttled) inside the
///   `tower::BoxError` (or a 429 response, with `refusals_as_responses`);
///   a 429 past the clamp, the deadline or the retries is `rate_limited`,
///   never a plain 429; a fault past its retries is the last answer as it
///   was. An inner call still running at the deadline is dropped
///   (`timed_out`).
/// * **Not under `HintRetry`**: the layer retries itself.
/// * **Cancellation.** Dropping the response future gives back what
///   `admit` took so far, or the ticket.
///
/// # Examples
///
/// ```
/// use backpressure::tower::AdmissionLayer;
/// use backpressure::admission::{Admission, CallSpec, SlotPolicy};
/// use backpressure::Status;
/// use backpressure::Throttled;
/// use tower::{service_fn, Layer, ServiceExt};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let admission = Admission::builder().tool("refund", 1, SlotPolicy::FailFast).build();
/// let layer = AdmissionLayer::new(admission.clone(), |req: &(&str, u32)| CallSpec::new(req.0, "key"));
/// let (tx, rx) = tokio::sync::oneshot::channel::<()>();
/// let rx = std::sync::Arc::new(tokio::sync::Mutex::new(Some(rx)));
/// let svc = layer.layer(service_fn(move |req: (&str, u32)| {
///     let rx = rx.clone();
///     async move {
///         if let Some(rx) = rx.lock().await.take() {
///             let _ = rx.await; // the first refund runs until told to stop
///         }
///         Ok::<_, std::io::Error>(req.1)
///     }
/// }));
/// let first = tokio::spawn(svc.clone().oneshot(("refund", 1)));
/// while admission.stats().in_flight == 0 {
///     tokio::task::yield_now().await;
/// }
/// // The refund tool runs one call at a time and fails fast.
/// let err = svc.clone().oneshot(("refund", 2)).await.unwrap_err();
/// assert_eq!(err.downcast_ref::<Throttled>().unwrap().status, Status::Shed);
/// tx.send(()).unwrap();
/// assert_eq!(first.await.unwrap().unwrap(), 1);
/// assert_eq!(admission.stats().in_flight, 0); // the ticket came back
/// # });
/// ```
pub struct AdmissionLayer<
    M,
    O = ObserveOk,
    Sl = DefaultSleeper,
    C: Clock = DefaultClock,
    R = AtHead,
> {
    admission: Admission<Sl, C>,
    spec: M,
    observe: O,
    release: R,
    deadline: Option<Duration>,
    retry: Arc<RetryPolicy>,
    /// The reads in flight, when identical reads share one request.
    reads: Option<Arc<exchange::Reads>>,
}

impl<M, Sl, C: Clock> AdmissionLayer<M, ObserveOk, Sl, C> {
    /// Admits each request as `spec(&req)`; a response reports success.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Admission, CallSpec};
    /// use backpressure::tower::AdmissionLayer;
    /// let layer = AdmissionLayer::new(Admission::builder().build(), |tool: &String| {
    ///     CallSpec::new(tool.as_str(), "key")
    /// });
    /// assert_eq!(layer.default_deadline(), None);
    /// ```
    pub fn new(admission: Admission<Sl, C>, spec: M) -> Self {
        AdmissionLayer {
            admission,
            spec,
            observe: ObserveOk,
            release: AtHead,
            deadline: None,
            retry: Arc::new(crate::admission::attempt::default_policy()),
            reads: None,
        }
    }
}

#[cfg(feature = "http")]
impl<F, Sl, C: Clock> AdmissionLayer<HttpSpec<F>, ObserveHttp, Sl, C> {
    /// For `http::Request`s: admits each request as `spec(&req)` (a
    /// [`RequestDeadline`](crate::retry::RequestDeadline) in its
    /// extensions overrides the deadline), and observes the
    /// `http::Response`'s status and limit headers.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::tower::AdmissionLayer;
    /// use backpressure::admission::{Admission, CallSpec};
    /// use std::time::Duration;
    /// let layer = AdmissionLayer::http(Admission::builder().build(), |req: &http::Request<String>| {
    ///     CallSpec::new(req.uri().path(), "key")
    /// })
    /// .deadline(Duration::from_secs(5));
    /// assert_eq!(layer.default_deadline(), Some(Duration::from_secs(5)));
    /// ```
    pub fn http(admission: Admission<Sl, C>, spec: F) -> Self {
        AdmissionLayer::new(admission, HttpSpec(spec)).observe_with(ObserveHttp)
    }
}

#[cfg(feature = "http")]
impl<M, Sl, C: Clock, R> AdmissionLayer<M, ObserveHttp, Sl, C, R> {
    /// Answers the layer's own refusals (not admitted, past the deadline, or
    /// a 429 past what the call could wait) as a synthetic 429 response (503
    /// when closed) instead of an error, shaped like
    /// [`Throttled::to_response`](crate::Throttled::to_response): for clients,
    /// such as LLM clients, that retry any transport error at once but keep a
    /// 429. A refusal answered by an inner layer (it carries the header) is
    /// never fed to the learned rate. The body type must be `From<Vec<u8>>`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Admission, CallSpec};
    /// use backpressure::tower::AdmissionLayer;
    /// use backpressure::Throttled;
    /// use tower::{service_fn, Layer, ServiceExt};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let admission = Admission::builder().run_budget(1).build();
    /// let svc = AdmissionLayer::http(admission, |_: &http::Request<()>| CallSpec::new("chat", "key"))
    ///     .refusals_as_responses()
    ///     .layer(service_fn(|_req: http::Request<()>| async {
    ///         Ok::<_, std::io::Error>(http::Response::new(b"{}".to_vec()))
    ///     }));
    /// let first = svc.clone().oneshot(http::Request::new(())).await.unwrap();
    /// assert_eq!(first.status(), 200);
    /// // The run's budget is spent: a 429 the client reads, not an error.
    /// let refused = svc.oneshot(http::Request::new(())).await.unwrap();
    /// assert_eq!(refused.status(), 429);
    /// assert!(Throttled::is_refusal(refused.headers()));
    /// # });
    /// ```
    pub fn refusals_as_responses(self) -> AdmissionLayer<M, RefusalResponses, Sl, C, R> {
        self.observe_with(RefusalResponses)
    }
}

impl<M, O, Sl, C: Clock, R> AdmissionLayer<M, O, Sl, C, R> {
    /// The deadline of every request, replacing the one its spec has
    /// (a request's own `RequestDeadline` still beats it).
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Observes responses with `observe` (a closure
    /// `Fn(&Result<Resp, BoxError>) -> Option<(u16, ServerHint)>`, or any
    /// observer).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::tower::AdmissionLayer;
    /// use tower::BoxError;
    /// use backpressure::admission::{Admission, CallSpec};
    /// use backpressure::headers::ServerHint;
    /// // The inner service answers with a status code.
    /// let layer = AdmissionLayer::new(Admission::builder().build(), |_: &()| CallSpec::new("t", "k"))
    ///     .observe_with(|r: &Result<u16, BoxError>| r.as_ref().ok().map(|s| (*s, ServerHint::default())));
    /// # drop(layer);
    /// ```
    pub fn observe_with<O2>(self, observe: O2) -> AdmissionLayer<M, O2, Sl, C, R> {
        self.map(|_| observe, |release| release)
    }

    /// Settles each call's ticket with what its response says it used,
    /// as `(quota name, units)` (the costs in the spec are the estimate):
    /// the usage the server reports in a header, or a body the response
    /// already holds. Keeps the observer (refusals answered as it does).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Admission, CallSpec};
    /// use backpressure::tower::AdmissionLayer;
    /// use backpressure::{ManualClock, Quota};
    /// use std::num::NonZeroU32;
    /// use tower::{service_fn, Layer, ServiceExt};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let admission = Admission::builder()
    ///     .clock(ManualClock::new())
    ///     .resource("tokens", Quota::per_minute(NonZeroU32::new(10_000).unwrap()))
    ///     .build();
    /// let svc = AdmissionLayer::http(admission.clone(), |_: &http::Request<()>| {
    ///     CallSpec::new("chat", "key").cost("tokens", 4_000) // an estimate
    /// })
    /// .usage_from(|resp: &http::Response<Vec<u8>>| {
    ///     let used = resp.headers()["x-usage-tokens"].to_str().unwrap().parse().unwrap();
    ///     vec![("tokens".to_string(), used)]
    /// })
    /// .layer(service_fn(|_req: http::Request<()>| async {
    ///     let mut resp = http::Response::new(Vec::new());
    ///     resp.headers_mut().insert("x-usage-tokens", "805".parse().unwrap());
    ///     Ok::<_, std::io::Error>(resp)
    /// }));
    /// svc.oneshot(http::Request::new(())).await.unwrap();
    /// assert_eq!(admission.available("key", "tokens"), Some(10_000 - 805));
    /// # });
    /// ```
    pub fn usage_from<F>(self, usage: F) -> AdmissionLayer<M, UsageFrom<O, F>, Sl, C, R> {
        self.map(|observe| UsageFrom { observe, usage }, |release| release)
    }

    /// The retry policy (each request forks its own): which answers are
    /// retried, how often, and the longest server wait slept. The default
    /// is `Runner`'s and the reqwest middleware's: 3 retries, full jitter
    /// from 100 ms to 5 s, server waits slept up to 2 s. `max_retries(0)`
    /// sends each request once.
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.retry = Arc::new(policy);
        self
    }

    /// Identical reads in flight at once share one request: a call whose
    /// request has the same read key (`AdmissionLayer::http`: a `GET` or
    /// `HEAD` with the same URI) and credential as one in flight waits
    /// for it and gets a clone of its answer (`Attempts(0)`), as
    /// `Runner`'s calls and the reqwest middleware's do. The response
    /// type must be `Clone` (`http::Response<B>` with `B: Clone`:
    /// `Vec<u8>`, `String`, `Bytes`, `Full<Bytes>`); a streamed body is
    /// not, so leave this off for streams. Call it after
    /// [`observe_with`](Self::observe_with) and
    /// `refusals_as_responses`, which replace the observer.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Admission, CallSpec};
    /// use backpressure::tower::AdmissionLayer;
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use std::sync::Arc;
    /// use tower::{service_fn, Layer, ServiceExt};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let sent = Arc::new(AtomicUsize::new(0));
    /// let counter = sent.clone();
    /// let svc = AdmissionLayer::http(Admission::builder().build(), |_: &http::Request<()>| {
    ///     CallSpec::new("search", "key")
    /// })
    /// .coalesce_reads()
    /// .layer(service_fn(move |_req: http::Request<()>| {
    ///     counter.fetch_add(1, Ordering::SeqCst);
    ///     async {
    ///         tokio::task::yield_now().await; // still running when the second read comes
    ///         Ok::<_, std::io::Error>(http::Response::new(b"[#1]".to_vec()))
    ///     }
    /// }));
    /// let get = || http::Request::get("/search?q=refund").body(()).unwrap();
    /// let (a, b) = tokio::join!(svc.clone().oneshot(get()), svc.clone().oneshot(get()));
    /// assert_eq!(a.unwrap().body(), b.unwrap().body());
    /// assert_eq!(sent.load(Ordering::SeqCst), 1); // one request for two identical reads
    /// # });
    /// ```
    pub fn coalesce_reads(self) -> AdmissionLayer<M, hooks::Copies<O>, Sl, C, R> {
        AdmissionLayer {
            reads: Some(Arc::new(exchange::Reads::new())),
            ..self.map(hooks::Copies, |release| release)
        }
    }

    /// The layer's deadline, if [`deadline`](Self::deadline) set one.
    pub fn default_deadline(&self) -> Option<Duration> {
        self.deadline
    }

    /// The shared admission (for its [`stats`](Admission::stats)).
    pub fn admission(&self) -> &Admission<Sl, C> {
        &self.admission
    }

    /// This layer with its observer and its release made over.
    fn map<O2, R2>(
        self,
        observe: impl FnOnce(O) -> O2,
        release: impl FnOnce(R) -> R2,
    ) -> AdmissionLayer<M, O2, Sl, C, R2> {
        AdmissionLayer {
            admission: self.admission,
            spec: self.spec,
            observe: observe(self.observe),
            release: release(self.release),
            deadline: self.deadline,
            retry: self.retry,
            reads: self.reads,
        }
    }
}

#[cfg(feature = "http")]
impl<M, O, Sl, C: Clock> AdmissionLayer<M, O, Sl, C, AtHead> {
    /// Holds each call's ticket in the response's body (a `TicketBody`) until
    /// the body is read to its end, fails or is dropped, instead of releasing
    /// it with the head: the concurrency limits count replies still streaming.
    /// With [`usage_from_stream`](AdmissionLayer::usage_from_stream), the
    /// usage the stream reports settles the estimate. A body cut off by an
    /// error counts against the circuit. For `http::Response`s.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Admission, CallSpec};
    /// use backpressure::admission::Provider;
    /// use backpressure::tower::AdmissionLayer;
    /// use backpressure::{ManualClock, Quota};
    /// use http_body_util::BodyExt;
    /// use std::num::NonZeroU32;
    /// use tower::{service_fn, Layer, ServiceExt};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let admission = Admission::builder()
    ///     .clock(ManualClock::new())
    ///     .resource("tokens", Quota::per_minute(NonZeroU32::new(10_000).unwrap()))
    ///     .build();
    /// let svc = AdmissionLayer::http(admission.clone(), |_: &http::Request<()>| {
    ///     CallSpec::new("chat", "key").cost("tokens", 4_000) // an estimate
    /// })
    /// .hold_bodies()
    /// .usage_from_stream(Provider::usage_in_event)
    /// .layer(service_fn(|_req: http::Request<()>| async {
    ///     // An OpenAI-style stream whose last chunk reports the usage.
    ///     let sse = "data: {\"choices\":[]}\n\ndata: {\"usage\":{\"prompt_tokens\":700,\"completion_tokens\":105}}\n\n";
    ///     Ok::<_, std::io::Error>(http::Response::new(sse.to_string()))
    /// }));
    /// let response = svc.oneshot(http::Request::new(())).await.unwrap();
    /// assert!(response.body().holds_ticket());
    /// assert_eq!(admission.stats().in_flight, 1); // the stream holds its slot
    /// let body = response.into_body().collect().await.unwrap().to_bytes();
    /// assert!(body.starts_with(b"data: "));
    /// assert_eq!(admission.stats().in_flight, 0);
    /// assert_eq!(admission.available("key", "tokens"), Some(10_000 - 805));
    /// # });
    /// ```
    pub fn hold_bodies(self) -> AdmissionLayer<M, O, Sl, C, AtBodyEnd> {
        self.map(|observe| observe, |_| AtBodyEnd::default())
    }
}

#[cfg(feature = "http")]
impl<M, O, Sl, C: Clock> AdmissionLayer<M, O, Sl, C, AtBodyEnd> {
    /// What a held body's server-sent events say the call used: `f` reads
    /// each `data:` line ([`Provider::usage_in_event`](crate::admission::Provider::usage_in_event)),
    /// the largest count per quota name is kept, and the ticket is settled
    /// with them when the body ends. A body dropped early settles nothing.
    ///
    /// # Examples
    ///
    /// See [`hold_bodies`](AdmissionLayer::hold_bodies).
    pub fn usage_from_stream(
        mut self,
        f: impl Fn(&[u8]) -> Vec<(String, u32)> + Send + Sync + 'static,
    ) -> Self {
        self.release.usage = Some(std::sync::Arc::new(f));
        self
    }
}

impl<M: Clone, O: Clone, Sl, C: Clock, R: Clone> Clone for AdmissionLayer<M, O, Sl, C, R> {
    fn clone(&self) -> Self {
        AdmissionLayer {
            admission: self.admission.clone(),
            spec: self.spec.clone(),
            observe: self.observe.clone(),
            release: self.release.clone(),
            deadline: self.deadline,
            retry: self.retry.clone(),
            reads: self.reads.clone(),
        }
    }
}

impl<M, O, Sl, C: Clock, R> fmt::Debug for AdmissionLayer<M, O, Sl, C, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionLayer")
            .field("admission", &self.admission)
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl<S, M: Clone, O: Clone, Sl, C: Clock, R: Clone> Layer<S> for AdmissionLayer<M, O, Sl, C, R> {
    type Service = AdmissionService<S, M, O, Sl, C, R>;

    fn layer(&self, inner: S) -> Self::Service {
        AdmissionService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of [`AdmissionLayer`]. Clones share the admission.
///
/// # Examples
///
/// ```
/// use backpressure::tower::AdmissionLayer;
/// use backpressure::admission::{Admission, CallSpec};
/// use tower::{service_fn, Layer, ServiceExt};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let admission = Admission::builder().run_budget(10).build();
/// let svc = AdmissionLayer::new(admission.clone(), |_: &String| CallSpec::new("search", "key"))
///     .layer(service_fn(|q: String| async move { Ok::<_, std::io::Error>(q.len()) }));
/// assert_eq!(svc.clone().oneshot("rust".to_string()).await.unwrap(), 4);
/// assert_eq!(admission.stats().admitted, 1);
/// # });
/// ```
pub struct AdmissionService<
    S,
    M,
    O = ObserveOk,
    Sl = DefaultSleeper,
    C: Clock = DefaultClock,
    R = AtHead,
> {
    inner: S,
    layer: AdmissionLayer<M, O, Sl, C, R>,
}

impl<S, M, O, Sl, C: Clock, R> AdmissionService<S, M, O, Sl, C, R> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, M, O, Sl, C, R, Req> Service<Req> for AdmissionService<S, M, O, Sl, C, R>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
    S::Response: Send + 'static,
    R::Response: Send + 'static,
    Req: Clone + Send + 'static,
    M: MakeSpec<Req>,
    O: Observe<S::Response> + Clone + Send + Sync + 'static,
    Sl: Sleeper + Send + Sync + 'static,
    Sl::Sleep: Send,
    C: Clock + Clone + Send + Sync + 'static,
    R: Release<S::Response, Sl, C> + Clone + Send + Sync + 'static,
{
    type Response = R::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<R::Response, BoxError>> + Send>>;

    /// The inner service's readiness: the admission needs the request.
    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let layer = &self.layer;
        let mut spec = layer.spec.make_spec(&req);
        if let Some(deadline) = layer.spec.request_deadline(&req).or(layer.deadline) {
            spec.deadline = deadline;
        }
        let admission = layer.admission.clone();
        let policy = layer.retry.clone();
        let (observe, release) = (layer.observe.clone(), layer.release.clone());
        // Tower's contract: `call` the service that said ready; keep a fresh
        // clone, to be polled ready again.
        let fresh = self.inner.clone();
        let ready = core::mem::replace(&mut self.inner, fresh);
        // A write through a layer told its LLM provider is a completion,
        // whose only effect is its cost.
        if spec.write && admission.told_provider() {
            spec.idempotent = true;
        }
        let key = layer
            .reads
            .as_ref()
            .filter(|_| !spec.write)
            .and_then(|flights| {
                let what = layer.spec.read_key(&req)?;
                Some((
                    flights.clone(),
                    ReadKey::new(&spec.tool, &spec.credential, &what),
                ))
            });
        Box::pin(async move {
            let exchange = exchange::Exchange::new(ready, req, observe.clone());
            let Some((flights, key)) = key else {
                return exchange
                    .answer(&admission, &spec, &policy, &release)
                    .await
                    .0;
            };
            let budget = spec.deadline;
            let (admitting, releasing) = (&admission, &release);
            let led = admission
                .coalesce(&flights, key, budget, |left| async move {
                    let spec = spec.deadline(left);
                    let (own, copy) = exchange.answer(admitting, &spec, &policy, releasing).await;
                    let own: exchange::Erased = Box::new(own);
                    let copy = copy.map(|c| Arc::new(Mutex::new(c)) as exchange::ErasedCopy);
                    (own, copy)
                })
                .await;
            match led {
                Joined::Own(own) => *own
                    .downcast::<Result<R::Response, BoxError>>()
                    .expect("a read's own answer has the layer's response type"),
                Joined::Copy(copy, _) => {
                    exchange::joined::<S::Response, _, _, _, _>(&*copy, &observe, &release)
                }
                Joined::TimedOut(refused) => {
                    exchange::refusal(&observe, refused).map(|r| release.release(r, None))
                }
            }
        })
    }
}

impl<S: Clone, M: Clone, O: Clone, Sl, C: Clock, R: Clone> Clone
    for AdmissionService<S, M, O, Sl, C, R>
{
    fn clone(&self) -> Self {
        AdmissionService {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S: fmt::Debug, M, O, Sl, C: Clock, R> fmt::Debug for AdmissionService<S, M, O, Sl, C, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionService")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}
