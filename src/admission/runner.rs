//! `Runner`: executes one model turn's calls through [`Admission`] and
//! returns their results in input order. Identical reads share one
//! execution; every attempt (retries too) is admitted first; every reply
//! is fed back via `Ticket::observe`, and the call's [`RetryPolicy`] alone
//! decides whether and when to retry. A panic is contained in its call.

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::Poll;
use core::time::Duration;
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use crate::clock::Clock;
use crate::failure::CallFailure;
use crate::retry::{Backoff, RetryPolicy};
use crate::single_flight::Provenance;

use super::attempt::reads::{Reads, Sharing};
use super::identity::ReadKey;
use crate::sleep::Sleeper;

use super::attempt;
use super::Admission;

mod call;
mod result;

pub use call::{Call, Reply};
pub use result::CallResult;

/// Runs a turn's calls through an [`Admission`].
///
/// `V` is what a call's attempts return and `E` their error type
/// (`String` by default); `S` and `C` are the admission's sleeper and
/// clock.
///
/// # Examples
///
/// ```
/// use backpressure::admission::{Admission, Call, CallSpec, Reply, Runner};
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
///
/// With the caller's own error type:
///
/// ```
/// use backpressure::admission::{Admission, Call, CallFailure, CallResult, CallSpec, Runner};
/// use std::time::Duration;
///
/// # futures::executor::block_on(async {
/// let runner: Runner<String, std::io::Error> =
///     Runner::new(Admission::builder().build(), Duration::ZERO)
///         .retries(backpressure::retry::Backoff::new(Duration::ZERO, Duration::ZERO), 0);
/// let call = Call::new(CallSpec::new("fetch", "key"), || async {
///     Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
/// });
/// match runner.one(call).await {
///     CallResult::Failed { error: CallFailure::Transport(e), attempts: 1, .. } => {
///         assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused)
///     }
///     other => panic!("{other:?}"),
/// }
/// # });
/// ```
pub struct Runner<
    V,
    E = String,
    S = crate::sleep::DefaultSleeper,
    C: Clock = crate::clock::DefaultClock,
> {
    admission: Admission<S, C>,
    flights: Reads<CallResult<V, E>, CallResult<V, E>, C>,
    /// The template every call forks its own policy from.
    retry: Arc<RetryPolicy>,
}

impl<V, E, S, C> Runner<V, E, S, C>
where
    V: Clone + Send + Sync + 'static,
    S: Sleeper,
    C: Clock + Clone,
    E: Send + Sync + 'static,
{
    /// The clamp of the default policy: a server wait up to this is waited
    /// out, a longer one returned as `rate_limited` (the same 2 s as
    /// [`Builder::inline_wait`](super::Builder::inline_wait)'s default).
    pub const DEFAULT_CLAMP: Duration = attempt::DEFAULT_CLAMP;

    /// A runner over `admission` whose read cache keeps results for
    /// `cache_ttl` (zero disables the cache, not coalescing). Its
    /// [`RetryPolicy`] retries up to 3 times, with full jitter from 100 ms to
    /// 5 s, and sleeps server waits up to [`DEFAULT_CLAMP`](Self::DEFAULT_CLAMP).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Admission, Runner};
    /// use std::time::Duration;
    /// let runner: Runner<String> = Runner::new(Admission::builder().build(), Duration::from_secs(3));
    /// # let _ = runner;
    /// ```
    pub fn new(admission: Admission<S, C>, cache_ttl: Duration) -> Self {
        let clock = admission.clock().clone();
        let mut flights = Reads::builder().clock(clock);
        if !cache_ttl.is_zero() {
            flights = flights.cache(cache_ttl, 4096);
        }
        Self {
            admission,
            flights: flights.build(),
            retry: Arc::new(attempt::default_policy()),
        }
    }

    /// Sets the backoff of the retries (its seed makes runs reproducible)
    /// and how many retries a call gets, keeping the policy's clamp.
    pub fn retries(mut self, backoff: Backoff, max_retries: u32) -> Self {
        self.retry = Arc::new(self.retry.with_backoff(backoff, max_retries));
        self
    }

    /// Sets the whole retry policy (classification, retry cap, clamp,
    /// backoff); each call forks its own copy ([`RetryPolicy::fork`]).
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.retry = Arc::new(policy);
        self
    }

    /// Drops the turn's cached reads (call it at the end of a turn).
    pub fn clear_cache(&self) {
        self.flights.clear();
    }

    /// The admission layer the runner uses.
    pub fn admission(&self) -> &Admission<S, C> {
        &self.admission
    }

    /// Runs every call concurrently and returns the results in input order.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Admission, Call, CallSpec, Reply, Runner};
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
    pub async fn execute(&self, calls: Vec<Call<V, E>>) -> Vec<CallResult<V, E>> {
        // Identical reads (deadline included) are joined here by position, so
        // they share even when the first finishes before the others could find
        // its flight.
        let mut first: HashMap<(ReadKey, Duration), usize> = HashMap::new();
        let joins: Vec<Option<usize>> = calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let key = read_key(c)?;
                let leader = *first.entry((key, c.spec.deadline)).or_insert(i);
                (leader != i).then_some(leader)
            })
            .collect();
        drop(first);
        let futures: Vec<_> = calls
            .into_iter()
            .zip(&joins)
            .filter(|(_, join)| join.is_none())
            .map(|(c, _)| Box::pin(self.one(c)))
            .collect();
        let mut led = join_all(futures).await.into_iter();
        let mut results: Vec<CallResult<V, E>> = Vec::with_capacity(joins.len());
        for join in &joins {
            let result = match join {
                Some(leader) => results[*leader].clone().into_copy(Provenance::Joined),
                None => led.next().expect("one result per leading call"),
            };
            results.push(result);
        }
        results
    }

    /// Runs one call.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Admission, Call, CallSpec, Reply, Runner};
    /// use std::time::Duration;
    /// # futures::executor::block_on(async {
    /// let runner: Runner<&str> = Runner::new(Admission::builder().build(), Duration::ZERO);
    /// let r = runner.one(Call::new(CallSpec::new("t", "k"), || async { Ok(Reply::new(200, "ok")) })).await;
    /// assert_eq!(r.value(), Some(&"ok"));
    /// # });
    /// ```
    pub async fn one(&self, mut call: Call<V, E>) -> CallResult<V, E> {
        let deadline = call.spec.deadline;
        let Some(key) = read_key(&call) else {
            return self.contained(&mut call, deadline).await.0;
        };
        let call = &mut call;
        self.admission
            .coalesce(&self.flights, key, deadline, |left| async move {
                let (own, sharing) = self.contained(call, left).await;
                let share = sharing.with(|| Some(own.clone()));
                (own, share)
            })
            .await
            .into_result()
    }

    /// [`attempts`](Self::attempts), with a panic turned into
    /// [`CallResult::Panicked`]; the attempt's future (and ticket) is dropped.
    async fn contained(
        &self,
        call: &mut Call<V, E>,
        left: Duration,
    ) -> (CallResult<V, E>, Sharing) {
        let mut attempts = core::pin::pin!(self.attempts(call, left));
        core::future::poll_fn(|cx| {
            match std::panic::catch_unwind(AssertUnwindSafe(|| attempts.as_mut().poll(cx))) {
                Ok(p) => p,
                Err(payload) => {
                    let message = panic_message(&*payload);
                    Poll::Ready((CallResult::Panicked { message }, Sharing::Own))
                }
            }
        })
        .await
    }

    /// One call through the attempt loop within `left`.
    async fn attempts(&self, call: &mut Call<V, E>, left: Duration) -> (CallResult<V, E>, Sharing) {
        let mut exchange = Attempt {
            attempts: &mut call.attempts,
        };
        let ended = self
            .admission
            .drive(&call.spec, left, &self.retry, &mut exchange)
            .await;
        let sharing = ended.sharing();
        let result = ended.into_call_result(|result, _| match result {
            Ok(reply) if reply.is_success() => Ok(reply.value),
            // A final status (a 404), or the last of a fault's retries.
            Ok(reply) => Err(CallFailure::Status {
                status: reply.status,
            }),
            Err(e) => Err(CallFailure::Transport(Arc::new(e))),
        });
        (result, sharing)
    }
}

/// A [`Call`] as the attempt loop sends it.
struct Attempt<'a, V, E> {
    attempts: &'a mut core::pin::Pin<Box<dyn call::Attempts<V, E>>>,
}

impl<V, E> attempt::Exchange for Attempt<'_, V, E> {
    type Output = Reply<V>;
    type Error = E;

    fn can_send(&self) -> bool {
        true
    }

    fn send(&mut self) -> impl Future<Output = Result<Reply<V>, E>> {
        let attempts = &mut *self.attempts;
        attempts.as_mut().start();
        core::future::poll_fn(move |cx| attempts.as_mut().poll_attempt(cx))
    }

    fn read(&self, result: &Result<Reply<V>, E>) -> attempt::Read {
        match result {
            Ok(r) => attempt::Read::Answer {
                status: r.status,
                hint: r.hint.clone(),
                usage: r.usage.clone(),
            },
            Err(_) => attempt::Read::NoAnswer,
        }
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

/// The key a call's read shares, or `None` for a write or keyless call.
fn read_key<V, E>(call: &Call<V, E>) -> Option<ReadKey> {
    match (&call.key, call.spec.write) {
        (Some(key), false) => Some(ReadKey::new(&call.spec.tool, &call.spec.credential, key)),
        _ => None,
    }
}

impl<V, E, S, C: Clock> fmt::Debug for Runner<V, E, S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runner")
            .field("admission", &self.admission)
            .field("retry", &self.retry)
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
