//! [`CallResult::from_tower`]: how a call through an `http`
//! [`AdmissionLayer`](super::AdmissionLayer) ended.

use std::sync::Arc;

use super::super::BoxError;
use super::exchange::Unanswered;
use crate::admission::{CallFailure, CallResult};
use crate::retry::Attempts;
use crate::single_flight::Provenance;
use crate::Throttled;

/// See [`CallResult::from_tower`].
fn call_result<B>(
    result: Result<http::Response<B>, BoxError>,
) -> CallResult<http::Response<B>, BoxError> {
    match result {
        Ok(response) => {
            let attempts = response.extensions().get::<Attempts>().map_or(1, |a| a.0);
            let told = response.extensions().get::<Throttled>().cloned();
            if Throttled::is_refusal(response.headers()) {
                return match told {
                    Some(t) => CallResult::Throttled(t),
                    None => CallResult::Failed {
                        error: CallFailure::Status {
                            status: response.status().as_u16(),
                        },
                        not_retried: None,
                        attempts,
                    },
                };
            }
            if response.status().is_success() {
                CallResult::Done {
                    value: response,
                    provenance: Provenance::Leader,
                    attempts,
                }
            } else {
                CallResult::Failed {
                    error: CallFailure::Status {
                        status: response.status().as_u16(),
                    },
                    not_retried: told,
                    attempts,
                }
            }
        }
        Err(e) => {
            if let Some(t) = e.downcast_ref::<Throttled>() {
                return CallResult::Throttled(t.clone());
            }
            let (attempts, not_retried) = match e.downcast_ref::<Unanswered>() {
                Some(u) => (u.attempts(), u.not_retried().cloned()),
                None => (0, None),
            };
            CallResult::Failed {
                error: CallFailure::Transport(Arc::new(e)),
                not_retried,
                attempts,
            }
        }
    }
}

impl<B> CallResult<http::Response<B>, Box<dyn std::error::Error + Send + Sync>> {
    /// The answer of a call through an [`AdmissionLayer`](crate::tower::AdmissionLayer)
    /// built with `AdmissionLayer::http`, as [`Runner`](crate::admission::Runner)
    /// answers it: [`CallResult::Done`] with a 2xx response,
    /// [`CallResult::Throttled`] with a refusal (the error, or the synthetic
    /// 429 of `refusals_as_responses`), [`CallResult::Failed`] with any other
    /// status or an unanswered last attempt; each with the requests sent and
    /// why a fault was not retried. Serialized (feature `serde`), it is the
    /// JSON a model reads.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Admission, CallResult, CallSpec};
    /// use backpressure::retry::{Backoff, RetryPolicy};
    /// use backpressure::tower::AdmissionLayer;
    /// use std::time::Duration;
    /// use tower::{service_fn, Layer, ServiceExt};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let quick = RetryPolicy::new(Backoff::new(Duration::from_millis(1), Duration::from_millis(1)));
    /// let svc = AdmissionLayer::http(Admission::builder().build(), |_: &http::Request<()>| {
    ///     CallSpec::new("search", "key")
    /// })
    /// .retry_policy(quick.max_retries(2))
    /// .layer(service_fn(|_req: http::Request<()>| async {
    ///     let down = http::Response::builder().status(503).body(Vec::<u8>::new()).unwrap();
    ///     Ok::<_, std::io::Error>(down)
    /// }));
    /// match CallResult::from_tower(svc.oneshot(http::Request::new(())).await) {
    ///     CallResult::Failed { error, attempts, .. } => {
    ///         assert_eq!((error.http_status(), attempts), (503, 3));
    ///     }
    ///     other => panic!("{other:?}"),
    /// }
    /// # });
    /// ```
    pub fn from_tower(
        result: Result<http::Response<B>, Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        call_result(result)
    }
}
