//! A `reqwest_middleware` middleware over [`Admission`] (feature
//! `reqwest`, reqwest-middleware 0.5).

use core::fmt;
use core::hash::{BuildHasher, Hasher};
use core::time::Duration;
use std::sync::Arc;
use std::time::SystemTime;

use ::reqwest::{Request, Response};
use ::reqwest_middleware::{Error, Middleware, Next, Result};
use parking_lot::Mutex;

use crate::clock::{Clock, DefaultClock};
use crate::sleep::{Sleeper, ThreadSleeper};
use crate::{
    admission::Admission, admission::CallSpec, headers::ServerHint, retry::Deadline,
    retry::Decision, retry::RetryPolicy,
};

type Derive = Arc<dyn Fn(&Request) -> String + Send + Sync>;

/// A request's own deadline (shared with the tower `AdmissionLayer`).
pub use super::RequestDeadline;

/// Admits every request through an [`Admission`] before it is sent,
/// observes the response (status and headers: a 429 holds back the
/// credential), and retries 429, 503 and transport errors with a
/// [`RetryPolicy`] within the request's deadline.
///
/// * The **tool** of a request is, by default, its host and first path
///   segment (`api.example.com/v1`); the **credential** is a hash of the
///   configured header's value (`authorization` by default), never the
///   value itself, so it can be logged. Both can be replaced with
///   closures.
/// * The **deadline** is [`RequestDeadline`] from the request's
///   extensions, else the default (30 s). Admission waits, retries and
///   their backoff are all charged to it.
/// * A refusal (of the admission layer, or a server wait that does not fit
///   the deadline) is an [`Error::Middleware`] whose cause is a
///   [`Throttled`](crate::Throttled): `err.downcast_ref::<Throttled>()` on
///   the inner `anyhow::Error`, ready to serialize for a model. Past the
///   retry cap, the last response (or transport error) is returned as it
///   is.
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
pub struct AdmissionMiddleware<S: Sleeper = ThreadSleeper, C: Clock = DefaultClock> {
    admission: Admission<S, C>,
    tool: Derive,
    credential: Derive,
    deadline: Duration,
    retry: Arc<Mutex<RetryPolicy>>,
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
    pub fn new(admission: Admission<S, C>) -> Self {
        AdmissionMiddleware {
            admission,
            tool: Arc::new(default_tool),
            credential: credential_from_header("authorization".to_string()),
            deadline: Duration::from_secs(30),
            retry: Arc::new(Mutex::new(RetryPolicy::default())),
        }
    }

    /// Derives the tool of each request with `f`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::Admission;
    /// use backpressure::reqwest::AdmissionMiddleware;
    /// let m = AdmissionMiddleware::new(Admission::builder().build())
    ///     .tool_from(|req| req.url().path().to_string());
    /// # drop(m);
    /// ```
    pub fn tool_from(mut self, f: impl Fn(&Request) -> String + Send + Sync + 'static) -> Self {
        self.tool = Arc::new(f);
        self
    }

    /// Derives the credential of each request with `f` (make it a hash or
    /// an id, not a secret: it names quotas and may be logged).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::Admission;
    /// use backpressure::reqwest::AdmissionMiddleware;
    /// let m = AdmissionMiddleware::new(Admission::builder().build())
    ///     .credential_from(|_| "tenant-7".to_string());
    /// # drop(m);
    /// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::Admission;
    /// use backpressure::reqwest::AdmissionMiddleware;
    /// let m = AdmissionMiddleware::new(Admission::builder().build()).credential_header("x-api-key");
    /// # drop(m);
    /// ```
    pub fn credential_header(mut self, name: impl Into<String>) -> Self {
        self.credential = credential_from_header(name.into());
        self
    }

    /// The default deadline of a request without [`RequestDeadline`].
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::Admission;
    /// use backpressure::reqwest::AdmissionMiddleware;
    /// use std::time::Duration;
    /// let m = AdmissionMiddleware::new(Admission::builder().build()).deadline(Duration::from_secs(5));
    /// assert_eq!(m.default_deadline(), Duration::from_secs(5));
    /// ```
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// The retry policy (each request forks its own).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::Admission;
    /// use backpressure::retry::RetryPolicy;
    /// use backpressure::reqwest::AdmissionMiddleware;
    /// let m = AdmissionMiddleware::new(Admission::builder().build())
    ///     .retry_policy(RetryPolicy::default().max_retries(2));
    /// # drop(m);
    /// ```
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.retry = Arc::new(Mutex::new(policy));
        self
    }

    /// The default deadline.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::Admission;
    /// use backpressure::reqwest::AdmissionMiddleware;
    /// assert_eq!(AdmissionMiddleware::new(Admission::builder().build()).default_deadline().as_secs(), 30);
    /// ```
    pub fn default_deadline(&self) -> Duration {
        self.deadline
    }

    /// The credential the default derivation gives a header value: a
    /// stable 64-bit hash, in hex (use it to configure a quota with
    /// `Builder::quota`).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::reqwest::AdmissionMiddleware;
    /// let a = AdmissionMiddleware::<backpressure::ThreadSleeper>::credential_of(b"Bearer key-a");
    /// assert_eq!(a.len(), 16);
    /// assert_ne!(a, AdmissionMiddleware::<backpressure::ThreadSleeper>::credential_of(b"Bearer key-b"));
    /// ```
    pub fn credential_of(value: &[u8]) -> String {
        hash_credential(value)
    }
}

fn hash_credential(value: &[u8]) -> String {
    // Fixed seeds: the same key hashes alike in every process.
    let mut h = ahash::RandomState::with_seeds(0x6261, 0x636b, 0x7072, 0x6573).build_hasher();
    h.write(value);
    format!("{:016x}", h.finish())
}

fn credential_from_header(name: String) -> Derive {
    Arc::new(
        move |req: &Request| match req.headers().get(name.as_str()) {
            Some(v) => hash_credential(v.as_bytes()),
            None => "anonymous".to_string(),
        },
    )
}

/// Host and first path segment: `api.example.com/v1`.
fn default_tool(req: &Request) -> String {
    let url = req.url();
    let host = url.host_str().unwrap_or("");
    match url.path_segments().and_then(|mut s| s.next()) {
        Some(first) if !first.is_empty() => format!("{host}/{first}"),
        _ => host.to_string(),
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
    C: Clock + 'static,
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
        let mut deadline = Deadline::after(DefaultClock::new(), budget);
        let tool = (self.tool)(&req);
        let credential = (self.credential)(&req);
        let mut policy: Option<RetryPolicy> = None;
        let mut req = req;
        loop {
            let spec =
                CallSpec::new(tool.as_str(), credential.as_str()).deadline(deadline.remaining());
            let ticket = self
                .admission
                .admit(&spec)
                .await
                .map_err(Error::middleware)?;
            let copy = req.try_clone();
            let result = next.clone().run(req, extensions).await;
            let hint = match &result {
                Ok(response) => {
                    let status = response.status().as_u16();
                    let hint = ServerHint::from_header_map(response.headers(), SystemTime::now());
                    ticket.observe(status, &hint);
                    if status != 429 && status != 503 {
                        return result;
                    }
                    hint
                }
                Err(_) => ServerHint::default(),
            };
            drop(ticket);
            let Some(copy) = copy else { return result };
            let policy = policy.get_or_insert_with(|| self.retry.lock().fork());
            match policy.decide(&hint, &mut deadline) {
                Decision::Retry { after } => {
                    tokio::time::sleep(after).await;
                    req = copy;
                }
                Decision::Surface(s) => return Err(Error::middleware(s)),
                // The cap: the last answer stands.
                _ => return result,
            }
        }
    }
}
