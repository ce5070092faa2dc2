//! A `reqwest_middleware` middleware over [`Admission`] (feature
//! `reqwest`, reqwest-middleware 0.5).

use core::fmt;
use core::time::Duration;
use std::sync::Arc;

use ::reqwest::{Request, Response};
use ::reqwest_middleware::{Error, Middleware, Next, Result};

use crate::admission::attempt::Ended;
use crate::admission::identity::{self, ReadKey};
use crate::clock::{Clock, DefaultClock};
use crate::retry::{Attempts, RequestDeadline};
use crate::sleep::{DefaultSleeper, Sleeper};
use crate::{
    admission::Admission, admission::CallSpec, admission::Priority, retry::RetryPolicy, Throttled,
};

type Derive = Arc<dyn Fn(&Request) -> String + Send + Sync>;
/// Which requests beyond `GET` and `HEAD` are reads.
type Declared = Arc<dyn Fn(&Request) -> bool + Send + Sync>;
type Costs = Arc<dyn Fn(&Request) -> Vec<(String, u32)> + Send + Sync>;
type Usage = Arc<dyn Fn(&Response) -> Vec<(String, u32)> + Send + Sync>;
type BodyUsage = Arc<dyn Fn(&[u8]) -> Vec<(String, u32)> + Send + Sync>;

mod call;
mod exchange;
mod outcome;
mod stream;
mod usage;

use crate::admission::attempt::reads::{Joined, Reads};
use exchange::Exchange;
use outcome::Outcome;

/// Admits every request through an [`Admission`] before it is sent,
/// observes the response (status and headers: a 429 holds back the
/// credential), and retries 429, 503 and transport errors with a
/// [`RetryPolicy`] within the request's deadline. Every request ends as
/// one of the answers `Runner` gives:
///
/// | what happened | the caller gets |
/// | --- | --- |
/// | an answer that is not "not now" (2xx, 404, ...) | `Ok(response)`, with an [`Attempts`](crate::retry::Attempts) extension (requests sent, retries included) |
/// | refused by the admission layer (nothing sent) | a [`Throttled`] (`attempts: 0`) |
/// | 429 (or 503 with `Retry-After`) past the retries, or a server wait that does not fit the clamp or the deadline | a [`Throttled`] `rate_limited` with the server's wait, never a plain 429 |
/// | still running at the deadline | a [`Throttled`] `timed_out`: the request is dropped |
/// | a transport error or a 5xx past the retries | that error or response, as it was |
///
/// A [`Throttled`] reaches the caller as an [`Error::Middleware`] whose
/// cause it is (`err.downcast_ref::<Throttled>()` on the inner
/// `anyhow::Error`), or, with [`refusals_as_responses`](Self::refusals_as_responses),
/// as a synthetic 429 response an LLM client keeps ([`Throttled::to_response`](crate::Throttled::to_response)).
///
/// * The **tool** is, by default, the host and route
///   (`api.openai.com/v1/chat/completions`; id-like segments become `*`,
///   at most four segments); the **credential** is a hash of the
///   configured header's value (`authorization` by default), so it can be
///   logged ([`credential_of`](AdmissionMiddleware::credential_of)). Both
///   can be replaced with closures.
/// * The **deadline** is [`RequestDeadline`](crate::retry::RequestDeadline) from the request's
///   extensions, else the default (30 s); waits, requests, retries and
///   backoff are all charged to it.
/// * The **priority** is a [`Priority`](crate::admission::Priority) in the
///   request's extensions, else interactive (see
///   [`priority_lanes`](crate::admission::Builder::priority_lanes)).
/// * A bare or unparsable 429 waits [`RetryPolicy::BARE_429_HOLD`].
/// * **Costs**: [`cost_from`](Self::cost_from) says what a request draws
///   from the weighted quotas, [`usage_from`](Self::usage_from) what the
///   response says it used.
/// * A request whose body cannot be cloned (a stream) is sent once.
///
/// # Examples
///
/// ```
/// use backpressure::reqwest::AdmissionMiddleware;
/// use backpressure::admission::Admission;
/// use backpressure::Quota;
/// use std::num::NonZeroU32;
///
/// let admission = Admission::builder()
///     .default_quota(Quota::per_second(NonZeroU32::new(10).unwrap()))
///     .build();
/// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(AdmissionMiddleware::new(admission).credential_header("x-api-key"))
///     .build();
/// # drop(client);
/// ```
pub struct AdmissionMiddleware<S: Sleeper = DefaultSleeper, C: Clock = DefaultClock> {
    admission: Admission<S, C>,
    tool: Derive,
    credential: Derive,
    deadline: Duration,
    retry: Arc<RetryPolicy>,
    cost: Option<Costs>,
    usage: Option<Usage>,
    /// What a successful, non-streamed body says was used.
    body_usage: Option<BodyUsage>,
    /// What each event of a streamed body says was used.
    stream_usage: Option<Arc<stream::EventUsage>>,
    /// Refusals answered as synthetic 429 responses, not errors.
    responses: bool,
    /// Identical reads in flight at once share one request.
    coalesce: bool,
    /// Which other requests (a `POST` the caller knows to be a read) are reads.
    reads_when: Option<Declared>,
    /// Which other requests may be sent again after they may have run.
    idempotent_when: Option<Declared>,
    reads: Reads<Result<Response>, outcome::Copy, C>,
}

impl<S: Sleeper, C: Clock> AdmissionMiddleware<S, C> {
    /// The middleware over `admission`, with the default tool and
    /// credential, a 30 s deadline and [`RetryPolicy::default`].
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::Admission;
    /// use backpressure::reqwest::AdmissionMiddleware;
    /// let m = AdmissionMiddleware::new(Admission::builder().build());
    /// assert_eq!(m.default_deadline().as_secs(), 30);
    /// ```
    pub fn new(admission: Admission<S, C>) -> Self
    where
        C: Clone,
    {
        let admission_clock = admission.clock().clone();
        AdmissionMiddleware {
            admission,
            tool: Arc::new(default_tool),
            credential: credential_from_header("authorization".to_string()),
            deadline: Duration::from_secs(30),
            retry: Arc::new(crate::admission::attempt::default_policy()),
            cost: None,
            usage: None,
            body_usage: None,
            stream_usage: None,
            responses: false,
            coalesce: true,
            reads_when: None,
            idempotent_when: None,
            reads: Reads::builder().clock(admission_clock).build(),
        }
    }

    /// Derives the tool of each request with `f`.
    pub fn tool_from(mut self, f: impl Fn(&Request) -> String + Send + Sync + 'static) -> Self {
        self.tool = Arc::new(f);
        self
    }

    /// Derives the credential of each request with `f` (make it a hash or
    /// an id, not a secret: it names quotas and may be logged).
    pub fn credential_from(
        mut self,
        f: impl Fn(&Request) -> String + Send + Sync + 'static,
    ) -> Self {
        self.credential = Arc::new(f);
        self
    }

    /// The credential is a hash of this header's value (see
    /// [`credential_of`](Self::credential_of)); requests without it share
    /// the credential `"anonymous"`.
    pub fn credential_header(mut self, name: impl Into<String>) -> Self {
        self.credential = credential_from_header(name.into());
        self
    }

    /// The default deadline of a request without [`RequestDeadline`](crate::retry::RequestDeadline).
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// The retry policy (each request forks its own).
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.retry = Arc::new(policy);
        self
    }

    /// What each request draws from the layer's weighted quotas, as `(quota
    /// name, units)`, reserved all or nothing before it is sent. A name that
    /// matches no quota is refused (`quota_exhausted`), never sent unmetered.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::Admission;
    /// use backpressure::reqwest::AdmissionMiddleware;
    /// // An estimate from the request: its body's size, at ~4 bytes a token.
    /// let m = AdmissionMiddleware::new(Admission::builder().build()).cost_from(|req| {
    ///     let bytes = req.body().and_then(|b| b.as_bytes()).map_or(0, |b| b.len());
    ///     vec![("tokens".to_string(), (bytes / 4) as u32 + 1_000)]
    /// });
    /// # drop(m);
    /// ```
    pub fn cost_from(
        mut self,
        f: impl Fn(&Request) -> Vec<(String, u32)> + Send + Sync + 'static,
    ) -> Self {
        self.cost = Some(Arc::new(f));
        self
    }

    /// What a response says the request used, as `(quota name, units)` (from
    /// its headers), settled on the request's ticket in place of the
    /// [`cost_from`](Self::cost_from) estimate.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::Admission;
    /// use backpressure::reqwest::AdmissionMiddleware;
    /// let m = AdmissionMiddleware::new(Admission::builder().build()).usage_from(|resp| {
    ///     resp.headers()
    ///         .get("x-usage-tokens")
    ///         .and_then(|v| v.to_str().ok()?.parse().ok())
    ///         .map(|n| ("tokens".to_string(), n))
    ///         .into_iter()
    ///         .collect()
    /// });
    /// # drop(m);
    /// ```
    pub fn usage_from(
        mut self,
        f: impl Fn(&Response) -> Vec<(String, u32)> + Send + Sync + 'static,
    ) -> Self {
        self.usage = Some(Arc::new(f));
        self
    }

    /// What a successful response's body says the request used, as `(quota
    /// name, units)` ([`Provider::usage_in_body`](crate::admission::Provider::usage_in_body)
    /// reads OpenAI's and Anthropic's `usage`), settled like
    /// [`usage_from`](Self::usage_from). The body is read once and the caller
    /// gets an equivalent response; a streamed body (`text/event-stream`) is
    /// left to [`usage_from_stream`](Self::usage_from_stream).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::Admission;
    /// use backpressure::reqwest::AdmissionMiddleware;
    /// use backpressure::Quota;
    /// use std::num::NonZeroU32;
    /// let admission = Admission::builder()
    ///     .resource("tokens", Quota::per_minute(NonZeroU32::new(120_000).unwrap()))
    ///     .build();
    /// let m = AdmissionMiddleware::new(admission)
    ///     .cost_from(|_req| vec![("tokens".to_string(), 1_000)])
    ///     .usage_from_body(backpressure::admission::Provider::usage_in_body);
    /// # drop(m);
    /// ```
    pub fn usage_from_body(
        mut self,
        f: impl Fn(&[u8]) -> Vec<(String, u32)> + Send + Sync + 'static,
    ) -> Self {
        self.body_usage = Some(Arc::new(f));
        self
    }

    /// What a streamed reply (`text/event-stream`) says it used: `f` reads
    /// each event's data ([`Provider::usage_in_event`](crate::admission::Provider::usage_in_event)),
    /// the largest count per name is kept, and the ticket is settled with
    /// them when the body ends.
    ///
    /// A streamed reply keeps its ticket until its body is read to the end or
    /// dropped, with or without this, so the concurrency limits count streams
    /// still being read. A stream cut off by an error counts against the
    /// circuit, and settles nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::Admission;
    /// use backpressure::reqwest::AdmissionMiddleware;
    /// let m = AdmissionMiddleware::new(Admission::builder().build())
    ///     .usage_from_stream(backpressure::admission::Provider::usage_in_event);
    /// # drop(m);
    /// ```
    pub fn usage_from_stream(
        mut self,
        f: impl Fn(&[u8]) -> Vec<(String, u32)> + Send + Sync + 'static,
    ) -> Self {
        self.stream_usage = Some(Arc::new(f));
        self
    }

    /// Answers a refusal as a synthetic 429 response (503 for `closed`)
    /// instead of an error (see [`Throttled::to_response`](crate::Throttled::to_response)),
    /// for a client library that retries errors from its HTTP stack at once
    /// but keeps a 429.
    pub fn refusals_as_responses(mut self) -> Self {
        self.responses = true;
        self
    }

    /// Whether identical reads in flight at once share one request (on by
    /// default). Two requests are identical only when nothing their server
    /// could see differs: a `GET` or `HEAD` with the same method, whole URL,
    /// version and every header, byte for byte, and the same credential.
    /// Headers the client adds after its middleware (default headers, cookie
    /// jar) are not seen here: don't share one middleware between clients
    /// that differ in them.
    ///
    /// A joiner waits no longer than its own deadline (then it is
    /// `timed_out`, having sent nothing), and gets a copy of the answer
    /// (`attempts: 0`) only when one is safe to share: a body declaring at
    /// most 1 MiB, read within the first caller's deadline, or the server's
    /// fault. Otherwise (a stream, a larger body, a refusal or timeout) each
    /// joiner sends its own request. A write is never shared unless declared
    /// a read ([`reads_when`](Self::reads_when)).
    pub fn coalesce_reads(mut self, on: bool) -> Self {
        self.coalesce = on;
        self
    }

    /// Declares which requests beyond `GET` and `HEAD` are reads (an LLM
    /// completion the caller will accept the same answer for): identical ones
    /// in flight, compared with their body, share one request (see
    /// [`coalesce_reads`](Self::coalesce_reads)), and are retried after a
    /// fault. A streamed body is never shared.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::Admission;
    /// use backpressure::reqwest::AdmissionMiddleware;
    /// // The same prompt asked twice in one turn is sent once.
    /// let m = AdmissionMiddleware::new(Admission::builder().build())
    ///     .reads_when(|req| req.url().path().ends_with("/chat/completions"));
    /// # drop(m);
    /// ```
    pub fn reads_when(mut self, f: impl Fn(&Request) -> bool + Send + Sync + 'static) -> Self {
        self.reads_when = Some(Arc::new(f));
        self
    }

    /// Declares which requests may be sent again after they may have reached
    /// the server's handler. Otherwise a `POST` or `PATCH` is sent again only
    /// when the server did not run it (a 429, a 503, a refused connection).
    /// Idempotent methods (RFC 9110), declared reads, and every request
    /// through an admission told its [`Provider`](crate::admission::Provider)
    /// (a completion's only effect is its cost) need no declaration.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::Admission;
    /// use backpressure::reqwest::AdmissionMiddleware;
    /// // A POST carrying an idempotency key runs once, however often sent.
    /// let m = AdmissionMiddleware::new(Admission::builder().build())
    ///     .idempotent_when(|req| req.headers().contains_key("idempotency-key"));
    /// # drop(m);
    /// ```
    pub fn idempotent_when(mut self, f: impl Fn(&Request) -> bool + Send + Sync + 'static) -> Self {
        self.idempotent_when = Some(Arc::new(f));
        self
    }

    /// The default deadline.
    pub fn default_deadline(&self) -> Duration {
        self.deadline
    }
}

/// The functions a middleware is configured with, on the default type.
impl AdmissionMiddleware {
    /// The credential the middleware's default derivation gives a header
    /// value: a stable 64-bit hash, in hex. Ask
    /// [`Admission::learned_rate`] or [`Admission::stats`] with it, or
    /// configure a quota for it with `Builder::quota`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::reqwest::AdmissionMiddleware;
    /// let a = AdmissionMiddleware::credential_of(b"Bearer key-a");
    /// assert_eq!(a.len(), 16);
    /// assert_ne!(a, AdmissionMiddleware::credential_of(b"Bearer key-b"));
    /// ```
    pub fn credential_of(value: &[u8]) -> String {
        crate::admission::identity::credential_hash(value)
    }

    /// Sends `request` (from a client whose middleware includes an
    /// `AdmissionMiddleware`) and answers as
    /// [`Runner`](crate::admission::Runner) does: [`CallResult::Done`](crate::admission::CallResult::Done) with a
    /// 2xx response, [`CallResult::Throttled`](crate::admission::CallResult::Throttled) with a refusal (an error, or
    /// the synthetic 429 of `refusals_as_responses`), [`CallResult::Failed`](crate::admission::CallResult::Failed)
    /// with any other status or a transport error, each with the requests the
    /// call sent (0 when it joined an identical read) and why a fault was not
    /// retried. Serialized (feature `serde`), it is the JSON a model reads.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Admission, CallResult};
    /// use backpressure::reqwest::AdmissionMiddleware;
    /// use backpressure::retry::RequestDeadline;
    /// use std::time::Duration;
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// // Nothing listens on port 9 of loopback: the connection is refused.
    /// let middleware = AdmissionMiddleware::new(Admission::builder().build())
    ///     .retry_policy(backpressure::retry::RetryPolicy::default().max_retries(1));
    /// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new()).with(middleware).build();
    /// let request = client
    ///     .get("http://127.0.0.1:9/search")
    ///     .with_extension(RequestDeadline(Duration::from_secs(5)));
    /// match AdmissionMiddleware::call_result(request).await {
    ///     // A transport error stays one (never `rate_limited`), with its attempts.
    ///     CallResult::Failed { error, attempts, .. } => {
    ///         assert!(error.is_transport());
    ///         assert_eq!(attempts, 2);
    ///     }
    ///     other => panic!("{other:?}"),
    /// }
    /// # });
    /// ```
    pub async fn call_result(
        request: reqwest_middleware::RequestBuilder,
    ) -> crate::admission::CallResult<Response, Error> {
        outcome::call_result(request).await
    }
}

fn credential_from_header(name: String) -> Derive {
    Arc::new(
        move |req: &Request| match req.headers().get(name.as_str()) {
            Some(v) => crate::admission::identity::credential_hash(v.as_bytes()),
            None => "anonymous".to_string(),
        },
    )
}

/// The host and the path's route: `api.openai.com/v1/chat/completions`.
/// Id-like segments (any digit, except a version such as `v1`) become
/// `*`, and at most four segments are kept, so the registry stays small.
fn default_tool(req: &Request) -> String {
    let url = req.url();
    let mut tool = url.host_str().unwrap_or("").to_string();
    for segment in url
        .path_segments()
        .into_iter()
        .flatten()
        .filter(|s| !s.is_empty())
        .take(4)
    {
        tool.push('/');
        let version = segment.len() <= 3
            && segment.starts_with('v')
            && segment[1..].bytes().all(|b| b.is_ascii_digit());
        if !version && segment.bytes().any(|b| b.is_ascii_digit()) {
            tool.push('*');
        } else {
            tool.push_str(segment);
        }
    }
    tool
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::default_tool;

    fn tool(url: &str) -> String {
        default_tool(&reqwest::Request::new(
            reqwest::Method::POST,
            url.parse().unwrap(),
        ))
    }

    #[test]
    fn the_default_tool_is_the_route_not_the_first_segment() {
        assert_eq!(
            tool("https://api.openai.com/v1/chat/completions"),
            "api.openai.com/v1/chat/completions"
        );
        assert_eq!(
            tool("https://api.openai.com/v1/embeddings?x=1"),
            "api.openai.com/v1/embeddings"
        );
        assert_eq!(
            tool("https://api.example.com/v1/items/8731"),
            "api.example.com/v1/items/*"
        );
        assert_eq!(
            tool("https://api.example.com/v1/items/8732/notes"),
            "api.example.com/v1/items/*/notes"
        );
        assert_eq!(tool("https://h/a/b/c/d/e/f"), "h/a/b/c/d");
        assert_eq!(tool("https://h/"), "h");
    }
}

impl<S: Sleeper, C: Clock> fmt::Debug for AdmissionMiddleware<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionMiddleware")
            .field("admission", &self.admission)
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl<S, C> Middleware for AdmissionMiddleware<S, C>
where
    S: Sleeper + Send + Sync + 'static,
    S::Sleep: Send,
    C: Clock + Clone + 'static,
{
    async fn handle(
        &self,
        req: Request,
        extensions: &mut http::Extensions,
        next: Next<'_>,
    ) -> Result<Response> {
        let budget = extensions
            .get::<RequestDeadline>()
            .map_or(self.deadline, |d| d.0);
        // A request's priority travels as an extension, like its deadline.
        let priority = extensions.get::<Priority>().copied().unwrap_or_default();
        let mut spec = CallSpec::new((self.tool)(&req), (self.credential)(&req))
            .deadline(budget)
            .priority(priority);
        let declared = |f: &Option<Declared>| f.as_ref().is_some_and(|f| f(&req));
        let read = req.method().is_safe() || declared(&self.reads_when);
        if !read {
            spec = spec.write();
            if req.method().is_idempotent()
                || declared(&self.idempotent_when)
                || self.admission.told_provider()
            {
                spec = spec.idempotent();
            }
        }
        for (name, units) in self.cost.as_ref().map(|f| f(&req)).unwrap_or_default() {
            spec = spec.cost(name, units);
        }
        let Some(key) = self.read_key(&req, &spec) else {
            return self.run(&spec, req, extensions, next).await;
        };
        let clock = self.admission.clock().clone();
        let own = &mut *extensions;
        let led = self
            .admission
            .coalesce(&self.reads, key, budget, |left| async move {
                let spec = spec.clone().deadline(left);
                let deadline = crate::retry::Deadline::after(clock, left);
                let result = self.run(&spec, req, &mut *own, next).await;
                let outcome = own.get::<Outcome>().cloned();
                let sleeper = self.admission.sleeper();
                outcome::share(result, outcome, left, || {
                    sleeper.sleep(deadline.remaining())
                })
                .await
            })
            .await;
        match led {
            Joined::Own(result) => result,
            Joined::Copy(copy, _) => {
                let (result, outcome) = copy.answer();
                extensions.insert(outcome);
                result
            }
            Joined::TimedOut(refused) => {
                extensions.insert(Outcome::refused(refused.clone()));
                self.refuse(refused)
            }
        }
    }
}

impl<S, C> AdmissionMiddleware<S, C>
where
    S: Sleeper + Send + Sync + 'static,
    S::Sleep: Send,
    C: Clock + Clone + 'static,
{
    /// One request through the admission's attempt loop; how it ended goes
    /// into `extensions` (read by [`call_result`](Self::call_result)).
    async fn run(
        &self,
        spec: &CallSpec,
        req: Request,
        extensions: &mut http::Extensions,
        next: Next<'_>,
    ) -> Result<Response> {
        let mut exchange = Exchange {
            req: Some(req),
            extensions: &mut *extensions,
            next,
            usage: self.usage.as_ref(),
            body_usage: self.body_usage.as_ref(),
        };
        let ended = self
            .admission
            .drive(spec, spec.deadline, &self.retry, &mut exchange)
            .await;
        drop(exchange);
        let sharing = ended.sharing();
        let (result, mut outcome) = match ended {
            Ended::Answered {
                result,
                ticket,
                attempts,
            } => {
                let result = result.map(|sent| match ticket {
                    // A streamed reply carries its ticket until its body ends.
                    Some(ticket) if usage::is_stream(&sent.response) => {
                        let usage = self.stream_usage.clone();
                        stream::hold(sent.response, ticket, usage, attempts)
                    }
                    _ => with_attempts(sent.response, attempts),
                });
                (result, Outcome::new(attempts))
            }
            Ended::Throttled(refused) => (self.refuse(refused.clone()), Outcome::refused(refused)),
            // A fault not retried: the last answer stands.
            Ended::Failed {
                result,
                not_retried,
                attempts,
            } => {
                let result = result.map(|sent| with_attempts(sent.response, attempts));
                let outcome = Outcome {
                    not_retried,
                    ..Outcome::new(attempts)
                };
                (result, outcome)
            }
        };
        outcome.sharing = sharing;
        extensions.insert(outcome);
        result
    }

    /// The key identical reads in flight share (see
    /// [`coalesce_reads`](Self::coalesce_reads)), unless coalescing is
    /// off or the request is a write.
    fn read_key(&self, req: &Request, spec: &CallSpec) -> Option<ReadKey> {
        if !self.coalesce || spec.write {
            return None;
        }
        let body = !(req.method() == http::Method::GET || req.method() == http::Method::HEAD);
        if body && !self.reads_when.as_ref().is_some_and(|f| f(req)) {
            return None;
        }
        let what = identity::reqwest(req, body)?;
        Some(ReadKey::new(&spec.tool, &spec.credential, &what))
    }
}

impl<S: Sleeper, C: Clock> AdmissionMiddleware<S, C> {
    /// Answers a refusal as configured: an error whose cause is the
    /// `Throttled`, or a synthetic 429 response.
    fn refuse(&self, throttled: Throttled) -> Result<Response> {
        if self.responses {
            Ok(Response::from(throttled.to_response()))
        } else {
            Err(Error::middleware(throttled))
        }
    }
}

impl AdmissionMiddleware {
    /// The middleware's error as a boxed one, for a stack that takes
    /// `Box<dyn Error + Send + Sync>` (a tower service: async-openai's
    /// `with_http_service`): a refusal stays a [`Throttled`], so
    /// `err.downcast_ref::<Throttled>()` finds it; a transport error stays
    /// the `reqwest::Error`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::reqwest::AdmissionMiddleware;
    /// use backpressure::{Status, Throttled};
    /// let refused = reqwest_middleware::Error::middleware(Throttled::new(Status::Shed, "tool:x", "full"));
    /// let boxed = AdmissionMiddleware::boxed_error(refused);
    /// assert_eq!(boxed.downcast_ref::<Throttled>().unwrap().status, Status::Shed);
    /// ```
    pub fn boxed_error(e: Error) -> Box<dyn std::error::Error + Send + Sync> {
        match e {
            Error::Reqwest(e) => Box::new(e),
            Error::Middleware(e) => match e.downcast::<Throttled>() {
                Ok(throttled) => Box::new(throttled),
                Err(e) => e.into(),
            },
        }
    }
}

fn with_attempts(mut response: Response, sent: u32) -> Response {
    response.extensions_mut().insert(Attempts(sent));
    response
}
