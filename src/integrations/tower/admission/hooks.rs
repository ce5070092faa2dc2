//! How [`AdmissionLayer`](super::AdmissionLayer) turns a request into a
//! [`CallSpec`] and a response into what its ticket observes.

#[cfg(feature = "http")]
use core::fmt;
use core::time::Duration;

use super::super::BoxError;
use crate::{admission::CallSpec, headers::ServerHint};

/// Maps a request to the [`CallSpec`] it is admitted as: every closure
/// `Fn(&Req) -> CallSpec`, and (feature `http`) `HttpSpec`.
///
/// # Examples
///
///
/// ```
/// use backpressure::admission::{Admission, CallSpec};
/// use backpressure::tower::AdmissionLayer;
/// use tower::{service_fn, Layer, ServiceExt};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let admission = Admission::builder().build();
/// // (tool, credential) requests, admitted as such.
/// let svc = AdmissionLayer::new(admission.clone(), |req: &(String, String)| {
///     CallSpec::new(req.0.as_str(), req.1.as_str())
/// })
/// .layer(service_fn(|req: (String, String)| async move { Ok::<_, std::io::Error>(req.0.len()) }));
/// assert_eq!(svc.oneshot(("search".into(), "key".into())).await.unwrap(), 6);
/// assert_eq!(admission.stats().admitted, 1);
/// # });
/// ```
pub trait MakeSpec<Req> {
    /// The call `req` is admitted as.
    fn make_spec(&self, req: &Req) -> CallSpec;

    /// A deadline the request carries itself, which beats the layer's and the
    /// spec's. `None` by default.
    fn request_deadline(&self, req: &Req) -> Option<Duration> {
        let _ = req;
        None
    }

    /// What identifies `req` as a read for
    /// [`coalesce_reads`](super::AdmissionLayer::coalesce_reads): requests
    /// share one call only when these are equal (compared whole, never by
    /// hash), as are their tool and credential. It must hold everything the
    /// server could see that changes the answer. `None` (the default): never
    /// shared.
    fn read_key(&self, req: &Req) -> Option<String> {
        let _ = req;
        None
    }
}

impl<F, Req> MakeSpec<Req> for F
where
    F: Fn(&Req) -> CallSpec,
{
    #[inline]
    fn make_spec(&self, req: &Req) -> CallSpec {
        self(req)
    }
}

/// Reports an admitted call's outcome to its ticket: the status and hint
/// for [`Ticket::observe`](crate::admission::Ticket::observe), or `None`.
/// Implemented for every closure
/// `Fn(&Result<Resp, BoxError>) -> Option<(u16, ServerHint)>` and the
/// layer's own observers.
///
/// # Examples
///
///
/// ```
/// use backpressure::admission::{Admission, CallSpec};
/// use backpressure::headers::ServerHint;
/// use backpressure::tower::AdmissionLayer;
/// use backpressure::{Status, Throttled};
/// use std::time::SystemTime;
/// use tower::{service_fn, BoxError, Layer, ServiceExt};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// // A response that is its own status code: a 429 asks for a minute.
/// let svc = AdmissionLayer::new(Admission::builder().build(), |_: &()| CallSpec::new("t", "k"))
///     .observe_with(|r: &Result<u16, BoxError>| {
///         let told = ServerHint::from_headers([("retry-after", "60")], SystemTime::now());
///         r.as_ref().ok().map(|s| (*s, told))
///     })
///     .layer(service_fn(|()| async { Ok::<u16, std::io::Error>(429) }));
/// let err = svc.oneshot(()).await.unwrap_err();
/// assert_eq!(err.downcast_ref::<Throttled>().unwrap().status, Status::RateLimited);
/// # });
/// ```
pub trait Observe<Resp> {
    /// What to feed the ticket for `result`.
    fn observe(&self, result: &Result<Resp, BoxError>) -> Option<(u16, ServerHint)>;

    /// The response to answer one of the layer's own refusals with, instead
    /// of an error carrying the [`Throttled`](crate::Throttled). `None` (the
    /// default): the error.
    fn refusal(&self, refused: &crate::Throttled) -> Option<Resp> {
        let _ = refused;
        None
    }

    /// What the call used of each weighted quota, `(quota name, units)`, read
    /// from its answer and settled on the ticket before it is observed. `[]`
    /// (the default): the estimate stands.
    fn usage(&self, result: &Result<Resp, BoxError>) -> Vec<(String, u32)> {
        let _ = result;
        Vec::new()
    }

    /// A copy of `response` for a call that joined an identical read in
    /// flight. `None` (the default): the joining call sends its own request.
    fn copy(&self, response: &Resp) -> Option<Resp> {
        let _ = response;
        None
    }

    /// Records how the call ended on `response` where its type has room
    /// (`ObserveHttp` inserts [`Attempts`](crate::retry::Attempts) and the
    /// [`Throttled`](crate::Throttled) that stopped a retry). Nothing by default.
    fn record(&self, response: &mut Resp, attempts: u32, not_retried: Option<&crate::Throttled>) {
        let _ = (response, attempts, not_retried);
    }
}

/// An observer that also reads usage with a closure; made by
/// [`AdmissionLayer::usage_from`](super::AdmissionLayer::usage_from).
#[derive(Clone, Copy, Debug)]
pub struct UsageFrom<O, F> {
    pub(crate) observe: O,
    pub(crate) usage: F,
}

impl<O, F, Resp> Observe<Resp> for UsageFrom<O, F>
where
    O: Observe<Resp>,
    F: Fn(&Resp) -> Vec<(String, u32)>,
{
    #[inline]
    fn observe(&self, result: &Result<Resp, BoxError>) -> Option<(u16, ServerHint)> {
        self.observe.observe(result)
    }

    fn refusal(&self, refused: &crate::Throttled) -> Option<Resp> {
        self.observe.refusal(refused)
    }

    fn usage(&self, result: &Result<Resp, BoxError>) -> Vec<(String, u32)> {
        result.as_ref().map_or_else(|_| Vec::new(), &self.usage)
    }

    fn copy(&self, response: &Resp) -> Option<Resp> {
        self.observe.copy(response)
    }

    fn record(&self, response: &mut Resp, attempts: u32, not_retried: Option<&crate::Throttled>) {
        self.observe.record(response, attempts, not_retried);
    }
}

impl<F, Resp> Observe<Resp> for F
where
    F: Fn(&Result<Resp, BoxError>) -> Option<(u16, ServerHint)>,
{
    #[inline]
    fn observe(&self, result: &Result<Resp, BoxError>) -> Option<(u16, ServerHint)> {
        self(result)
    }
}

/// The default observer: a response is a 200 (a success for the learned
/// rate); an error reports nothing about the server's limits.
#[derive(Clone, Copy, Debug, Default)]
pub struct ObserveOk;

impl<Resp> Observe<Resp> for ObserveOk {
    #[inline]
    fn observe(&self, result: &Result<Resp, BoxError>) -> Option<(u16, ServerHint)> {
        result.as_ref().ok().map(|_| (200, ServerHint::default()))
    }
}

/// Observes an `http::Response`'s status and limit headers, so a 429 holds
/// back the credential. An error reports nothing.
#[cfg(feature = "http")]
#[derive(Clone, Copy, Debug, Default)]
pub struct ObserveHttp;

#[cfg(feature = "http")]
impl<B> Observe<http::Response<B>> for ObserveHttp {
    fn observe(&self, result: &Result<http::Response<B>, BoxError>) -> Option<(u16, ServerHint)> {
        let response = result.as_ref().ok()?;
        let hint = ServerHint::from_header_map(response.headers(), std::time::SystemTime::now());
        Some((response.status().as_u16(), hint))
    }

    fn record(
        &self,
        response: &mut http::Response<B>,
        attempts: u32,
        not_retried: Option<&crate::Throttled>,
    ) {
        let extensions = response.extensions_mut();
        extensions.insert(crate::retry::Attempts(attempts));
        if let Some(t) = not_retried {
            extensions.insert(t.clone());
        }
    }
}

/// A spec closure over `http::Request`s that also honours a
/// [`RequestDeadline`](crate::retry::RequestDeadline) extension.
#[cfg(feature = "http")]
#[derive(Clone, Copy)]
pub struct HttpSpec<F>(pub F);

#[cfg(feature = "http")]
impl<F, B> MakeSpec<http::Request<B>> for HttpSpec<F>
where
    F: Fn(&http::Request<B>) -> CallSpec,
{
    /// The closure's spec; an unsafe method (RFC 9110) makes it a write,
    /// idempotent when the method is.
    #[inline]
    fn make_spec(&self, req: &http::Request<B>) -> CallSpec {
        let mut spec = (self.0)(req);
        if !req.method().is_safe() {
            spec.write = true;
            spec.idempotent |= req.method().is_idempotent();
        }
        spec
    }

    #[inline]
    fn request_deadline(&self, req: &http::Request<B>) -> Option<Duration> {
        req.extensions()
            .get::<crate::retry::RequestDeadline>()
            .map(|d| d.0)
    }

    fn read_key(&self, req: &http::Request<B>) -> Option<String> {
        let read = req.method() == http::Method::GET || req.method() == http::Method::HEAD;
        read.then(|| {
            let target = req.uri().to_string();
            crate::admission::identity::http(
                req.method(),
                &target,
                req.version(),
                req.headers(),
                None,
            )
        })
    }
}

#[cfg(feature = "http")]
impl<F> fmt::Debug for HttpSpec<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpSpec").finish_non_exhaustive()
    }
}

/// `ObserveHttp`, with the layer's own refusals answered as responses
/// ([`Throttled::to_response`](crate::Throttled::to_response)). A refusal
/// answered by an inner layer (it carries the
/// [`Throttled::REFUSAL_HEADER`](crate::Throttled::REFUSAL_HEADER)) is
/// never fed to the learned rate.
#[cfg(feature = "http")]
#[derive(Clone, Copy, Debug, Default)]
pub struct RefusalResponses;

#[cfg(feature = "http")]
impl<B: From<Vec<u8>>> Observe<http::Response<B>> for RefusalResponses {
    fn observe(&self, result: &Result<http::Response<B>, BoxError>) -> Option<(u16, ServerHint)> {
        let response = result.as_ref().ok()?;
        if crate::Throttled::is_refusal(response.headers()) {
            // Ours, not the server's: nothing to learn from it.
            return None;
        }
        ObserveHttp.observe(result)
    }

    fn refusal(&self, refused: &crate::Throttled) -> Option<http::Response<B>> {
        Some(refused.to_response().map(B::from))
    }

    fn record(
        &self,
        response: &mut http::Response<B>,
        attempts: u32,
        not_retried: Option<&crate::Throttled>,
    ) {
        ObserveHttp.record(response, attempts, not_retried);
    }
}

/// An observer whose responses are cloned for calls that joined an
/// identical read in flight.
#[derive(Clone, Copy, Debug, Default)]
pub struct Copies<O>(pub(crate) O);

impl<O, Resp: Clone> Observe<Resp> for Copies<O>
where
    O: Observe<Resp>,
{
    #[inline]
    fn observe(&self, result: &Result<Resp, BoxError>) -> Option<(u16, ServerHint)> {
        self.0.observe(result)
    }

    fn refusal(&self, refused: &crate::Throttled) -> Option<Resp> {
        self.0.refusal(refused)
    }

    fn usage(&self, result: &Result<Resp, BoxError>) -> Vec<(String, u32)> {
        self.0.usage(result)
    }

    fn copy(&self, response: &Resp) -> Option<Resp> {
        Some(response.clone())
    }

    fn record(&self, response: &mut Resp, attempts: u32, not_retried: Option<&crate::Throttled>) {
        self.0.record(response, attempts, not_retried);
    }
}
