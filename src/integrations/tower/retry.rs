//! [`HintRetry`]: a `tower::retry::Policy` that listens to the server
//! (`Retry-After`, `RateLimit` resets) and to the call's deadline.

use core::fmt;
use core::time::Duration;
use std::sync::Arc;

use ::tower::retry::Policy;

use crate::clock::{Clock, DefaultClock};
use crate::sleep::{DefaultSleeper, Sleeper};
use crate::{headers::ServerHint, Throttled};
use crate::{retry::Deadline, retry::Decision, retry::RetryPolicy};

/// A [`tower::retry::Policy`](::tower::retry::Policy) that decides through
/// the crate's [`RetryPolicy`] and charges every wait to a [`Deadline`].
///
/// A classifier (see [`new`](HintRetry::new)) reads each result: `None`
/// means done; `Some((status, hint))` is the answer to decide on (status
/// `None` for a transport error). [`HintRetry::http`] reads
/// `http::Response`s itself. Then, as [`RetryPolicy::decide_reply`] says:
///
/// * a 429 (or a 503 with `Retry-After`) sleeps the server's wait (plus
///   jitter), or [`RetryPolicy::BARE_429_HOLD`] when it gave none; a 408,
///   5xx or transport error sleeps the backoff; both on the [`Sleeper`];
/// * a capacity answer whose wait does not fit the clamp or the deadline,
///   or that outlasts the retries, becomes `Err(Throttled)` `rate_limited`
///   with the server's wait and the requests sent, never a plain 429;
/// * a fault the policy will not retry (cap or deadline) stays the result
///   it was.
///
/// # Per call
///
/// Tower clones the policy for every request; each clone starts a fresh
/// deadline of `budget` and forks a fresh [`RetryPolicy`] from the template.
///
/// # Examples
///
/// ```
/// use backpressure::tower::HintRetry;
/// use backpressure::headers::ServerHint;
/// use backpressure::retry::RetryPolicy;
/// use backpressure::Status;
/// use backpressure::{ManualClock, Throttled};
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use std::sync::Arc;
/// use std::time::{Duration, SystemTime};
/// use tower::retry::RetryLayer;
/// use tower::{service_fn, BoxError, Layer, ServiceExt};
///
/// # futures::executor::block_on(async {
/// // A server that always answers "429, Retry-After: 120".
/// let calls = Arc::new(AtomicU32::new(0));
/// let c = calls.clone();
/// let server = service_fn(move |()| {
///     c.fetch_add(1, Ordering::Relaxed);
///     async { Ok::<u16, BoxError>(429) }
/// });
/// let clock = ManualClock::new();
/// let policy = HintRetry::new(RetryPolicy::default(), Duration::from_secs(30), |r: &Result<u16, BoxError>| {
///     let told = ServerHint::from_headers([("retry-after", "120")], SystemTime::now());
///     matches!(r, Ok(429)).then(|| (Some(429), told))
/// })
/// .with_clock(clock.clone())
/// .with_sleeper(clock);
/// let err = RetryLayer::new(policy).layer(server).oneshot(()).await.unwrap_err();
/// // Two minutes do not fit a 30 s budget: no sleep, no second request.
/// let t = err.downcast_ref::<Throttled>().unwrap();
/// assert_eq!(t.status, Status::RateLimited);
/// assert_eq!(t.retry_after(), Some(Duration::from_secs(120)));
/// assert_eq!(calls.load(Ordering::Relaxed), 1);
/// # });
/// ```
pub struct HintRetry<F, C: Clock = DefaultClock, Sl = DefaultSleeper> {
    template: Arc<RetryPolicy>,
    /// This call's policy, forked from the template at the first failure.
    policy: Option<RetryPolicy>,
    budget: Duration,
    deadline: Deadline<C>,
    classify: F,
    sleeper: Sl,
}

impl<F> HintRetry<F, DefaultClock, DefaultSleeper> {
    /// Retries as `policy` says within `budget` per call, with what
    /// `classify` (`FnMut(&Result<Res, E>) -> Option<(Option<u16>, ServerHint)>`)
    /// reads from each result: `None` when there is nothing to decide, else
    /// the status (`None` for a transport error) and the server's hint.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::headers::ServerHint;
    /// use backpressure::retry::RetryPolicy;
    /// use backpressure::tower::HintRetry;
    /// use std::time::Duration;
    /// // A transport error (no status) is worth a retry.
    /// let policy = HintRetry::new(RetryPolicy::default(), Duration::from_secs(10), |r: &Result<(), std::io::Error>| {
    ///     r.is_err().then(|| (None::<u16>, ServerHint::default()))
    /// });
    /// assert_eq!(policy.budget(), Duration::from_secs(10));
    /// ```
    pub fn new(policy: RetryPolicy, budget: Duration, classify: F) -> Self {
        let clock = DefaultClock::new();
        HintRetry {
            template: Arc::new(policy),
            policy: None,
            budget,
            deadline: Deadline::after(clock, budget),
            classify,
            sleeper: DefaultSleeper::new(),
        }
    }
}

impl<F, C: Clock, Sl> HintRetry<F, C, Sl> {
    /// Measures deadlines on `clock` (a `ManualClock` in tests).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::headers::ServerHint;
    /// use backpressure::retry::RetryPolicy;
    /// use backpressure::{ManualClock, tower::HintRetry};
    /// use std::time::Duration;
    /// let policy = HintRetry::new(RetryPolicy::default(), Duration::from_secs(1), |_: &Result<(), ()>| None::<(Option<u16>, ServerHint)>)
    ///     .with_clock(ManualClock::new());
    /// # let _ = policy;
    /// ```
    pub fn with_clock<C2: Clock>(self, clock: C2) -> HintRetry<F, C2, Sl> {
        HintRetry {
            template: self.template,
            policy: None,
            budget: self.budget,
            deadline: Deadline::after(clock, self.budget),
            classify: self.classify,
            sleeper: self.sleeper,
        }
    }

    /// Sleeps between attempts on `sleeper` (a `ManualClock` in tests).
    pub fn with_sleeper<S2: Sleeper>(self, sleeper: S2) -> HintRetry<F, C, S2> {
        HintRetry {
            template: self.template,
            policy: self.policy,
            budget: self.budget,
            deadline: self.deadline,
            classify: self.classify,
            sleeper,
        }
    }

    /// The per-call budget.
    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// What is left of this call's deadline.
    pub fn remaining(&self) -> Duration {
        self.deadline.remaining()
    }
}

impl<F: Clone, C: Clock + Clone, Sl: Clone> Clone for HintRetry<F, C, Sl> {
    /// A policy for a new call: a fresh deadline from now, no attempts yet.
    fn clone(&self) -> Self {
        HintRetry {
            template: self.template.clone(),
            policy: None,
            budget: self.budget,
            deadline: Deadline::after(self.deadline.clock().clone(), self.budget),
            classify: self.classify.clone(),
            sleeper: self.sleeper.clone(),
        }
    }
}

impl<F, C: Clock, Sl: fmt::Debug> fmt::Debug for HintRetry<F, C, Sl> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HintRetry")
            .field("policy", &self.policy)
            .field("budget", &self.budget)
            .field("deadline", &self.deadline)
            .field("sleeper", &self.sleeper)
            .finish_non_exhaustive()
    }
}

/// The classifier of an `http::Response` stack: a function pointer, so
/// [`HintRetry::http`] is nameable.
#[cfg(feature = "http")]
type ClassifyHttp<B> =
    fn(&Result<http::Response<B>, super::BoxError>) -> Option<(Option<u16>, ServerHint)>;

/// Classifies `http::Response`s by status and limit headers. An error is a
/// transport error, except a [`Throttled`] (final here); a synthetic
/// refusal response is final too.
#[cfg(feature = "http")]
fn classify_http<B>(
    result: &Result<http::Response<B>, super::BoxError>,
) -> Option<(Option<u16>, ServerHint)> {
    match result {
        Ok(r) if crate::Throttled::is_refusal(r.headers()) => None,
        // The answer of an `AdmissionLayer`, which retried it already.
        Ok(r) if r.extensions().get::<crate::retry::Attempts>().is_some() => None,
        Ok(r) => Some((
            Some(r.status().as_u16()),
            ServerHint::from_header_map(r.headers(), std::time::SystemTime::now()),
        )),
        Err(e) if e.downcast_ref::<Throttled>().is_some() => None,
        // A fault an `AdmissionLayer` retried already.
        Err(e) if e.is::<super::Unanswered>() => None,
        Err(_) => Some((None, ServerHint::default())),
    }
}

#[cfg(feature = "http")]
impl<B> HintRetry<ClassifyHttp<B>, DefaultClock, DefaultSleeper> {
    /// For a stack over `http::Request`s and `http::Response`s (feature
    /// `http`): reads each response's status and limit headers, so a bare
    /// 429 waits the bare-429 hold and a final one is `rate_limited`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::retry::RetryPolicy;
    /// use backpressure::tower::HintRetry;
    /// use std::time::Duration;
    /// use tower::{retry::RetryLayer, service_fn, ServiceBuilder, ServiceExt};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let policy = HintRetry::http(RetryPolicy::default(), Duration::from_secs(10));
    /// assert_eq!(policy.budget(), Duration::from_secs(10));
    /// // The body type is the stack's.
    /// let svc = ServiceBuilder::new()
    ///     .layer(RetryLayer::new(policy))
    ///     .service(service_fn(|_: http::Request<()>| async {
    ///         Ok::<_, tower::BoxError>(http::Response::new(b"ok".to_vec()))
    ///     }));
    /// assert_eq!(svc.oneshot(http::Request::new(())).await.unwrap().status(), 200);
    /// # });
    /// ```
    pub fn http(policy: RetryPolicy, budget: Duration) -> Self {
        HintRetry::new(policy, budget, classify_http::<B>)
    }
}

impl<Req, Res, E, F, C, Sl> Policy<Req, Res, E> for HintRetry<F, C, Sl>
where
    Req: Clone,
    E: From<Throttled>,
    F: FnMut(&Result<Res, E>) -> Option<(Option<u16>, ServerHint)>,
    C: Clock,
    Sl: Sleeper,
{
    type Future = Sl::Sleep;

    fn retry(&mut self, _req: &mut Req, result: &mut Result<Res, E>) -> Option<Sl::Sleep> {
        // Forked on the first answer: the first attempt a shared retry budget counts.
        let template = &self.template;
        let policy = self.policy.get_or_insert_with(|| template.fork());
        let (status, hint) = (self.classify)(result)?;
        let attempt = policy.retries() + 1;
        match crate::admission::attempt::decide(
            policy,
            "tower",
            status,
            crate::retry::reply_class(status, &hint),
            &hint,
            &mut self.deadline,
            attempt,
        ) {
            Decision::Retry { after } | Decision::Readmit { after } => {
                Some(self.sleeper.sleep(after))
            }
            // The server's capacity, not retried: a rate limit.
            Decision::Surface(t) => {
                *result = Err(E::from(t.with_attempts(policy.retries() + 1)));
                None
            }
            // A fault not retried (cap, deadline): the last answer stands.
            _ => None,
        }
    }

    fn clone_request(&mut self, req: &Req) -> Option<Req> {
        Some(req.clone())
    }
}
