//! The tower layers (feature `tower`) against real services: counts and a
//! `ManualClock` where time matters, never wall-clock assertions.

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use backpressure::headers::ServerHint;
use backpressure::retry::{Backoff, Jitter, RetryPolicy};
use backpressure::tower::{ConcurrencyLimitLayer, HintRetry, KeyedRateLimitLayer, RateLimitLayer};
use backpressure::Status;
use backpressure::{ManualClock, Quota, Scoped, Throttled, TokenBucket};
use futures::FutureExt;
use tower::retry::RetryLayer;
use tower::{service_fn, BoxError, Layer, Service, ServiceExt};

type BoxFut<T> = Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>;

/// A service that counts calls and in-flight requests; each request
/// finishes when its `tokio::sync::oneshot` sender fires (or is dropped).
#[derive(Clone, Default)]
struct Probe {
    calls: Arc<AtomicUsize>,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: Arc<AtomicUsize>,
}

impl Probe {
    /// A service answering after `work` completes.
    fn service<W, F>(
        &self,
        work: W,
    ) -> impl Service<u32, Response = u32, Error = BoxError, Future = BoxFut<u32>> + Clone + use<W, F>
    where
        W: Fn(u32) -> F + Clone + Send + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        let probe = self.clone();
        service_fn(move |x: u32| {
            let probe = probe.clone();
            let work = work(x);
            probe.calls.fetch_add(1, Ordering::SeqCst);
            let now = probe.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            probe.max_in_flight.fetch_max(now, Ordering::SeqCst);
            Box::pin(async move {
                struct Leave(Arc<AtomicUsize>);
                impl Drop for Leave {
                    fn drop(&mut self) {
                        self.0.fetch_sub(1, Ordering::SeqCst);
                    }
                }
                let _leave = Leave(probe.in_flight.clone());
                work.await;
                Ok(x)
            }) as BoxFut<u32>
        })
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

fn throttled(e: &BoxError) -> &Throttled {
    e.downcast_ref::<Throttled>()
        .unwrap_or_else(|| panic!("not a Throttled: {e}"))
}

// ---------------------------------------------------------------------------
// ConcurrencyLimitLayer

#[tokio::test]
async fn concurrency_limit_queues_the_fourth_request_until_a_permit_returns() {
    let probe = Probe::default();
    let layer = ConcurrencyLimitLayer::new(3);
    let sem = layer.semaphore().clone();
    let gates: Arc<parking_lot::Mutex<Vec<tokio::sync::oneshot::Sender<()>>>> = Arc::default();
    let g = gates.clone();
    let svc = layer.layer(probe.service(move |_| {
        let (tx, rx) = tokio::sync::oneshot::channel();
        g.lock().push(tx);
        async move {
            let _ = rx.await;
        }
    }));

    let mut held = Vec::new();
    for i in 0..3 {
        let mut s = svc.clone();
        held.push(s.ready().await.unwrap().call(i));
    }
    assert_eq!(sem.available_permits(), 0);
    let mut fourth = Box::pin(svc.clone().oneshot(3));
    assert!(
        fourth.as_mut().now_or_never().is_none(),
        "queued, not called"
    );
    assert_eq!(probe.calls(), 3);

    // Finish one: its permit goes to the queued request.
    let tx = gates.lock().remove(0);
    tx.send(()).unwrap();
    let first = held.remove(0);
    assert_eq!(first.await.unwrap(), 0);
    let gate = loop {
        // The fourth gets the permit and calls the inner service.
        assert!(fourth.as_mut().now_or_never().is_none());
        if let Some(tx) = gates.lock().pop() {
            break tx;
        }
        tokio::task::yield_now().await;
    };
    assert_eq!(probe.calls(), 4);
    gate.send(()).unwrap();
    assert_eq!(fourth.await.unwrap(), 3);
    for tx in gates.lock().drain(..) {
        tx.send(()).unwrap();
    }
    for f in held {
        f.await.unwrap();
    }
    assert_eq!(sem.available_permits(), 3);
    assert_eq!(probe.max_in_flight.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_limit_holds_across_clones_on_many_tasks() {
    let probe = Probe::default();
    let layer = ConcurrencyLimitLayer::new(4);
    let sem = layer.semaphore().clone();
    let svc = layer.layer(probe.service(|_| async {
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
    }));
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let svc = svc.clone();
            tokio::spawn(async move { svc.oneshot(i).await.unwrap() })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(probe.calls(), 200);
    assert!(probe.max_in_flight.load(Ordering::SeqCst) <= 4);
    assert_eq!(sem.available_permits(), 4);
}

#[tokio::test]
async fn concurrency_limit_rejects_with_shed_and_the_drain_estimate() {
    let probe = Probe::default();
    let layer = ConcurrencyLimitLayer::new(1).reject(Duration::from_millis(250));
    let svc = layer.layer(probe.service(|_| std::future::pending::<()>()));
    let mut a = svc.clone();
    let held = a.ready().await.unwrap().call(1);
    let err = svc.clone().oneshot(2).await.unwrap_err();
    let t = throttled(&err);
    assert_eq!(t.status, Status::Shed);
    assert_eq!(t.scope, "concurrency");
    assert_eq!(t.retry_after_ms, Some(250));
    assert_eq!(probe.calls(), 1, "a shed request never reaches the service");
    drop(held);
    assert_eq!(layer.semaphore().available_permits(), 1);
    assert!(svc.oneshot(3).now_or_never().is_none(), "admitted again");
}

/// The cancellation test: response futures (and requests queued in
/// `poll_ready`) are dropped mid-flight by `tokio::time::timeout`, again
/// and again; every permit must come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_response_futures_return_their_permits() {
    let probe = Probe::default();
    let layer = ConcurrencyLimitLayer::new(3);
    let sem = layer.semaphore().clone();
    // Half the requests never finish, the rest take a few yields.
    let svc = layer.layer(probe.service(|x| async move {
        if x % 2 == 0 {
            std::future::pending::<()>().await;
        }
        for _ in 0..(x % 5) {
            tokio::task::yield_now().await;
        }
    }));
    let timed_out = Arc::new(AtomicUsize::new(0));
    for round in 0..30u32 {
        let tasks: Vec<_> = (0..8u32)
            .map(|i| {
                let svc = svc.clone();
                let timed_out = timed_out.clone();
                tokio::spawn(async move {
                    let call = svc.oneshot(round * 8 + i);
                    if tokio::time::timeout(Duration::from_millis(1), call)
                        .await
                        .is_err()
                    {
                        timed_out.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(sem.available_permits(), 3, "round {round}");
        assert_eq!(probe.in_flight.load(Ordering::SeqCst), 0, "round {round}");
    }
    assert!(timed_out.load(Ordering::SeqCst) >= 30 * 4);
    assert!(probe.max_in_flight.load(Ordering::SeqCst) <= 3);
    // Still usable.
    let ok = ConcurrencyLimitLayer::with_semaphore(sem.clone())
        .layer(probe.service(|_| async {}))
        .oneshot(1)
        .await
        .unwrap();
    assert_eq!(ok, 1);
}

// ---------------------------------------------------------------------------
// RateLimitLayer

fn bucket(rate: u32, clock: &ManualClock) -> Arc<TokenBucket<ManualClock>> {
    Arc::new(TokenBucket::with_clock(
        Quota::per_second(NonZeroU32::new(rate).unwrap()),
        clock.clone(),
    ))
}

#[tokio::test]
async fn rate_limit_clones_share_one_bucket_and_reject_with_the_exact_wait() {
    let clock = ManualClock::new();
    let probe = Probe::default();
    let svc = RateLimitLayer::new(bucket(4, &clock)).layer(probe.service(|_| async {}));
    let mut admitted = 0;
    let mut refused = Vec::new();
    for i in 0..10 {
        // A fresh clone per request: tower's own RateLimit would give each
        // clone its own window.
        match svc.clone().oneshot(i).await {
            Ok(_) => admitted += 1,
            Err(e) => refused.push(throttled(&e).clone()),
        }
    }
    assert_eq!(admitted, 4);
    assert_eq!(probe.calls(), 4);
    assert_eq!(refused.len(), 6);
    for t in &refused {
        assert_eq!(t.status, Status::RateLimited);
        assert_eq!(t.retry_after(), Some(Duration::from_millis(250)));
    }
    clock.advance(Duration::from_millis(250));
    svc.clone().oneshot(99).await.unwrap();
    assert!(svc.oneshot(100).await.is_err());
    assert_eq!(probe.calls(), 5);
}

#[tokio::test]
async fn rate_limit_waits_within_the_budget_and_refuses_beyond_it() {
    let clock = ManualClock::new();
    let sleeper = clock.clone();
    let probe = Probe::default();
    let bucket = bucket(1, &clock);
    let svc = RateLimitLayer::new(bucket.clone())
        .wait_up_to(Duration::from_secs(2), sleeper.clone())
        .layer(probe.service(|_| async {}));

    svc.clone().oneshot(1).await.unwrap();
    // The second cell is 1 s away: within the budget, so it waits.
    let mut second = Box::pin(svc.clone().oneshot(2));
    assert!(second.as_mut().now_or_never().is_none());
    // The third would be 2 s away: still within. The fourth, 3 s: refused
    // at once, consuming nothing.
    let mut third = Box::pin(svc.clone().oneshot(3));
    assert!(third.as_mut().now_or_never().is_none());
    let err = svc.clone().oneshot(4).await.unwrap_err();
    assert_eq!(throttled(&err).retry_after(), Some(Duration::from_secs(3)));
    assert_eq!(probe.calls(), 1);

    sleeper.advance(Duration::from_secs(1));
    assert_eq!(second.await.unwrap(), 2);
    assert!(third.as_mut().now_or_never().is_none());
    sleeper.advance(Duration::from_secs(1));
    assert_eq!(third.await.unwrap(), 3);
    assert_eq!(probe.calls(), 3);
    // The refused request took nothing: the next cell is 1 s away.
    assert_eq!(
        bucket.try_acquire(1).unwrap_err().wait(),
        Some(Duration::from_secs(1))
    );
}

/// Issue #21, item 3: a waiter holds no cell. 50 requests cancelled while
/// waiting used to leave the bucket 5 s in debt (each kept its reserved
/// cell, and a GCRA only gives back the one on top); and a ready service
/// dropped before `call` kept its cell.
#[tokio::test]
async fn rate_limit_cancelled_waiters_and_unused_ready_services_leave_no_debt() {
    let clock = ManualClock::new();
    let sleeper = clock.clone();
    let probe = Probe::default();
    let bucket = bucket(10, &clock);
    let svc = RateLimitLayer::new(bucket.clone())
        .wait_up_to(Duration::from_secs(10), sleeper.clone())
        .layer(probe.service(|_| async {}));
    // Spend the burst of 10.
    for i in 0..10 {
        svc.clone().oneshot(i).await.unwrap();
    }
    let mut waiting: Vec<_> = (0..50)
        .map(|i| Box::pin(svc.clone().oneshot(100 + i)))
        .collect();
    for w in &mut waiting {
        assert!(w.as_mut().now_or_never().is_none(), "a waiter went at once");
    }
    // Cancelled, oldest first (the order a GCRA cannot refund).
    drop(waiting);
    assert_eq!(
        bucket.try_acquire(1).unwrap_err().wait(),
        Some(Duration::from_millis(100)),
        "the cancelled waiters left debt"
    );
    // A waiter told its turn behind the 50 would have been refused at
    // once; with the line empty again, the next one waits one cell.
    let mut next = Box::pin(svc.clone().oneshot(200));
    assert!(next.as_mut().now_or_never().is_none());
    sleeper.advance(Duration::from_millis(100));
    assert_eq!(next.await.unwrap(), 200);

    // A ready service dropped unused gives its cell back.
    sleeper.advance(Duration::from_secs(1));
    let mut ready = svc.clone();
    futures::future::poll_fn(|cx| ready.poll_ready(cx))
        .await
        .unwrap();
    assert_eq!(bucket.available(), 9, "poll_ready took the cell");
    drop(ready);
    assert_eq!(bucket.available(), 10, "the unused cell was kept");
    assert_eq!(probe.calls(), 11);
}

// ---------------------------------------------------------------------------
// KeyedRateLimitLayer

#[tokio::test]
async fn keyed_rate_limit_limits_each_key_on_its_own() {
    let clock = ManualClock::new();
    let limits = Arc::new(Scoped::with_clock(
        Quota::per_second(NonZeroU32::new(2).unwrap()),
        clock.clone(),
    ));
    let probe = Probe::default();
    // Key: the request's tens digit.
    let svc = KeyedRateLimitLayer::new(limits.clone(), |x: &u32| x / 10)
        .layer(probe.service(|_| async {}));
    let mut ok = [0usize; 3];
    for key in 0..3u32 {
        for i in 0..5 {
            if svc.clone().oneshot(key * 10 + i).await.is_ok() {
                ok[key as usize] += 1;
            }
        }
    }
    assert_eq!(ok, [2, 2, 2]);
    assert_eq!(probe.calls(), 6);
    let err = svc.clone().oneshot(5).await.unwrap_err();
    assert_eq!(throttled(&err).scope, "rate:key");
    assert_eq!(
        throttled(&err).retry_after(),
        Some(Duration::from_millis(500))
    );
}

#[tokio::test]
async fn keyed_rate_limit_dropped_while_waiting_gives_the_cell_back() {
    let clock = ManualClock::new();
    let sleeper = clock.clone();
    let limits = Arc::new(Scoped::with_clock(
        Quota::per_second(NonZeroU32::new(1).unwrap()),
        clock.clone(),
    ));
    let probe = Probe::default();
    let svc = KeyedRateLimitLayer::new(limits.clone(), |_: &u32| "k")
        .wait_up_to(Duration::from_secs(5), sleeper.clone())
        .layer(probe.service(|_| async {}));
    svc.clone().oneshot(1).await.unwrap();
    for _ in 0..10 {
        let mut waiting = Box::pin(svc.clone().oneshot(2));
        assert!(waiting.as_mut().now_or_never().is_none());
        drop(waiting); // cancelled: the reservation is cancelled too
    }
    // No debt was left behind by the ten abandoned waits.
    assert_eq!(
        limits.try_acquire(&"k", 1).unwrap_err().wait(),
        Some(Duration::from_secs(1))
    );
    let mut waiting = Box::pin(svc.clone().oneshot(3));
    assert!(waiting.as_mut().now_or_never().is_none());
    sleeper.advance(Duration::from_secs(1));
    assert_eq!(waiting.await.unwrap(), 3);
    assert_eq!(probe.calls(), 2);
}

/// A manual clock and sleeper, and a registry of 10 cells/s per key with
/// no burst beyond one.
fn ten_per_second_no_burst() -> (
    ManualClock,
    ManualClock,
    Arc<Scoped<&'static str, ManualClock>>,
) {
    let clock = ManualClock::new();
    let sleeper = clock.clone();
    let limits = Arc::new(Scoped::with_clock(
        Quota::per_second(NonZeroU32::new(10).unwrap()).allow_burst(NonZeroU32::new(1).unwrap()),
        clock.clone(),
    ));
    (clock, sleeper, limits)
}

/// Issue #21, item 3 (keyed): 100 waiters on one key dropped oldest-first
/// left 10 s of debt (only the last reservation could be refunded).
#[tokio::test]
async fn keyed_rate_limit_waiters_dropped_oldest_first_leave_no_debt() {
    let (_clock, sleeper, limits) = ten_per_second_no_burst();
    let probe = Probe::default();
    let svc = KeyedRateLimitLayer::new(limits.clone(), |_: &u32| "k")
        .wait_up_to(Duration::from_secs(30), sleeper.clone())
        .layer(probe.service(|_| async {}));
    svc.clone().oneshot(0).await.unwrap();
    let mut waiting: Vec<_> = (1..=100)
        .map(|i| Box::pin(svc.clone().oneshot(i)))
        .collect();
    for w in &mut waiting {
        assert!(w.as_mut().now_or_never().is_none());
    }
    for w in waiting {
        drop(w);
    }
    assert_eq!(
        limits.try_acquire(&"k", 1).unwrap_err().wait(),
        Some(Duration::from_millis(100)),
        "the dropped waiters left debt"
    );
    assert_eq!(probe.calls(), 1);
}

/// Waiters on a key are told their turns in line: the k-th sleeps the next
/// cell plus k periods, and each goes at its own instant, one per period.
#[tokio::test]
async fn keyed_rate_limit_waiters_go_one_period_apart() {
    let (clock, sleeper, limits) = ten_per_second_no_burst();
    let started = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = started.clone();
    let at = clock.clone();
    let svc = KeyedRateLimitLayer::new(limits, |_: &u32| "k")
        .wait_up_to(Duration::from_secs(1), sleeper.clone())
        .layer(service_fn(move |i: u32| {
            log.lock()
                .unwrap()
                .push((i, backpressure::Clock::now_nanos(&at) / 1_000_000));
            async move { Ok::<_, BoxError>(i) }
        }));
    svc.clone().oneshot(0).await.unwrap();
    // Ten in line: the k-th's turn is 100 ms + k periods, the last at 1 s,
    // within the budget.
    let mut waiting: Vec<_> = (1..=10).map(|i| Box::pin(svc.clone().oneshot(i))).collect();
    for w in &mut waiting {
        assert!(w.as_mut().now_or_never().is_none());
    }
    // The eleventh's turn (1.1 s) is past the budget: refused at once.
    let err = svc.clone().oneshot(99).await.unwrap_err();
    assert_eq!(
        throttled(&err).retry_after(),
        Some(Duration::from_millis(1_100))
    );
    for _ in 0..10 {
        sleeper.advance(Duration::from_millis(100));
        waiting.retain_mut(|w| w.as_mut().now_or_never().is_none());
    }
    assert!(waiting.is_empty());
    let starts = started.lock().unwrap().clone();
    let want: Vec<(u32, u64)> = (0..=10).map(|i| (i, 100 * i as u64)).collect();
    assert_eq!(starts, want, "one per period, in line order");
}

/// A waiter beaten to its cell by a newcomer tries again with what is left
/// of its budget, not the whole budget again: its next turn past the
/// budget refuses it then (cargo-mutants: `Scoped::now_nanos -> 0`
/// survived every test before this one).
#[tokio::test]
async fn keyed_rate_limit_waiter_passed_by_a_newcomer_keeps_its_budget() {
    let (clock, sleeper, limits) = ten_per_second_no_burst();
    let probe = Probe::default();
    let svc = KeyedRateLimitLayer::new(limits.clone(), |_: &u32| "k")
        .wait_up_to(Duration::from_millis(150), sleeper.clone())
        .layer(probe.service(|_| async {}));
    svc.clone().oneshot(0).await.unwrap();
    let mut waiting = Box::pin(svc.clone().oneshot(1));
    assert!(waiting.as_mut().now_or_never().is_none(), "it waits 100 ms");
    clock.advance(Duration::from_millis(100));
    // A newcomer takes the cell the waiter slept towards.
    limits.try_acquire(&"k", 1).unwrap();
    let err = waiting
        .as_mut()
        .now_or_never()
        .expect("decided at once")
        .unwrap_err();
    // Its next turn is at 200 ms, past the 150 ms it was allowed.
    assert_eq!(throttled(&err).scope, "rate:key");
    assert_eq!(
        throttled(&err).retry_after(),
        Some(Duration::from_millis(100))
    );
    assert_eq!(probe.calls(), 1);
}

// ---------------------------------------------------------------------------
// HintRetry

/// A server: answers `429` with `retry_after` seconds for the first
/// `fails` requests, then `200`.
#[allow(clippy::type_complexity)] // an `impl Service` with its associated types spelt out
fn flaky_server(
    fails: usize,
    retry_after: &'static str,
) -> (
    Arc<AtomicUsize>,
    impl Service<
            (),
            Response = (u16, ServerHint),
            Error = BoxError,
            Future = BoxFut<(u16, ServerHint)>,
        > + Clone,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let svc = service_fn(move |()| {
        let n = c.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            if n < fails {
                let hint =
                    ServerHint::from_headers([("retry-after", retry_after)], SystemTime::now());
                Ok((429u16, hint))
            } else {
                Ok((200u16, ServerHint::default()))
            }
        }) as BoxFut<(u16, ServerHint)>
    });
    (calls, svc)
}

fn classify(r: &Result<(u16, ServerHint), BoxError>) -> Option<(Option<u16>, ServerHint)> {
    match r {
        Ok((status @ (429 | 503), hint)) => Some((Some(*status), hint.clone())),
        Ok(_) => None,
        Err(_) => Some((None, ServerHint::default())),
    }
}

fn policy() -> RetryPolicy {
    RetryPolicy::new(
        Backoff::new(Duration::from_millis(10), Duration::from_millis(100))
            .jitter(Jitter::None)
            .seed(7),
    )
}

/// Issue #23, item 4, through `HintRetry`: 20 calls to a service that
/// answers 503 to everything, with a shared retry budget of 20% and no
/// floor, send at most 24 requests (80 without the budget).
#[tokio::test]
async fn hint_retry_honours_a_shared_retry_budget() {
    use backpressure::retry::RetryBudget;
    const CALLS: usize = 20;
    for budgeted in [false, true] {
        let clock = ManualClock::new();
        let sleeper = clock.clone();
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let server = service_fn(move |()| {
            c.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Ok((503u16, ServerHint::default())) }) as BoxFut<(u16, ServerHint)>
        });
        let mut template = policy().max_retries(3);
        if budgeted {
            let budget = RetryBudget::with_clock(0.2, 0, Duration::from_secs(60), clock.clone());
            template = template.budget(Arc::new(budget));
        }
        let retry = HintRetry::new(template, Duration::from_secs(30), classify)
            .with_clock(clock.clone())
            .with_sleeper(sleeper.clone());
        let svc = RetryLayer::new(retry).layer(server);
        let mut all = Box::pin(futures::future::join_all(
            (0..CALLS).map(|_| svc.clone().oneshot(())),
        ));
        let results = loop {
            if let Some(r) = all.as_mut().now_or_never() {
                break r;
            }
            sleeper.advance(Duration::from_millis(10));
        };
        assert!(
            results.iter().all(|r| matches!(r, Ok((503, _)))),
            "the last answer stands"
        );
        let sent = calls.load(Ordering::SeqCst);
        if budgeted {
            assert!(
                (CALLS..=CALLS + CALLS / 5).contains(&sent),
                "{sent} requests"
            );
        } else {
            assert_eq!(sent, 4 * CALLS);
        }
    }
}

#[tokio::test]
async fn hint_retry_sleeps_the_servers_retry_after_then_succeeds() {
    let clock = ManualClock::new();
    let sleeper = clock.clone();
    let (calls, server) = flaky_server(2, "2");
    let retry = HintRetry::new(policy(), Duration::from_secs(30), classify)
        .with_clock(clock.clone())
        .with_sleeper(sleeper.clone());
    let mut call = Box::pin(RetryLayer::new(retry).layer(server).oneshot(()));
    assert!(call.as_mut().now_or_never().is_none());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // Retry-After: 2 -> no second request before 2 s.
    sleeper.advance(Duration::from_millis(1_999));
    assert!(call.as_mut().now_or_never().is_none());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    sleeper.advance(Duration::from_millis(20)); // 2 s plus the jitter (at most 10 ms)
    assert!(call.as_mut().now_or_never().is_none());
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    sleeper.advance(Duration::from_millis(2_020));
    let (status, _) = call.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn hint_retry_gives_up_with_throttled_instead_of_sleeping_past_the_deadline() {
    let clock = ManualClock::new();
    let sleeper = clock.clone();
    let (calls, server) = flaky_server(usize::MAX, "3");
    // 5 s of budget: one 3 s wait fits, a second does not.
    let retry = HintRetry::new(policy(), Duration::from_secs(5), classify)
        .with_clock(clock.clone())
        .with_sleeper(sleeper.clone());
    let svc = RetryLayer::new(retry).layer(server);
    let mut call = Box::pin(svc.clone().oneshot(()));
    assert!(call.as_mut().now_or_never().is_none());
    sleeper.advance(Duration::from_millis(3_010));
    let err = call.await.unwrap_err();
    let t = throttled(&err);
    assert_eq!(t.status, Status::RateLimited);
    assert_eq!(t.scope, "api_key"); // no scope named: the credential's limit
    assert_eq!(t.retry_after(), Some(Duration::from_secs(3)));
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    // Each call gets its own deadline: a new call starts with 5 s again.
    let mut call = Box::pin(svc.oneshot(()));
    assert!(call.as_mut().now_or_never().is_none(), "sleeps 3 s again");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn hint_retry_retries_transport_errors_with_backoff_up_to_the_cap() {
    let clock = ManualClock::new();
    let sleeper = clock.clone();
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let server = service_fn(move |()| {
        c.fetch_add(1, Ordering::SeqCst);
        async { Err::<(u16, ServerHint), BoxError>("connection reset".into()) }
    });
    let retry = HintRetry::new(policy().max_retries(2), Duration::from_secs(30), classify)
        .with_clock(clock.clone())
        .with_sleeper(sleeper.clone());
    let mut call = Box::pin(RetryLayer::new(retry).layer(server).oneshot(()));
    for _ in 0..10 {
        if let Some(out) = call.as_mut().now_or_never() {
            // The cap: the last error stands, not a Throttled.
            let err = out.unwrap_err();
            assert_eq!(err.to_string(), "connection reset");
            assert_eq!(calls.load(Ordering::SeqCst), 3);
            return;
        }
        sleeper.advance(Duration::from_millis(100));
    }
    panic!("never finished");
}

/// A 429 without a usable `Retry-After` was retried on the 10 ms backoff;
/// it waits the bare-429 hold, as `Runner` and the middleware do.
#[tokio::test]
async fn hint_retry_waits_the_bare_429_hold_for_a_429_without_a_wait() {
    let clock = ManualClock::new();
    let sleeper = clock.clone();
    let (calls, server) = flaky_server(1, "soon");
    let retry = HintRetry::new(policy(), Duration::from_secs(30), classify)
        .with_clock(clock.clone())
        .with_sleeper(sleeper.clone());
    let mut call = Box::pin(RetryLayer::new(retry).layer(server).oneshot(()));
    assert!(call.as_mut().now_or_never().is_none());
    sleeper.advance(RetryPolicy::BARE_429_HOLD - Duration::from_millis(1));
    assert!(call.as_mut().now_or_never().is_none());
    assert_eq!(calls.load(Ordering::SeqCst), 1, "retried before the hold");
    sleeper.advance(Duration::from_millis(20));
    let (status, _) = call.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// Past the cap a 429 came back as the plain `Ok(429)`; it is a
/// `rate_limited` with the server's wait and the requests sent.
#[tokio::test]
async fn hint_retry_surfaces_a_429_past_the_cap_as_rate_limited() {
    let clock = ManualClock::new();
    let sleeper = clock.clone();
    let (calls, server) = flaky_server(usize::MAX, "1");
    let retry = HintRetry::new(policy().max_retries(1), Duration::from_secs(30), classify)
        .with_clock(clock.clone())
        .with_sleeper(sleeper.clone());
    let mut call = Box::pin(RetryLayer::new(retry).layer(server).oneshot(()));
    assert!(call.as_mut().now_or_never().is_none());
    sleeper.advance(Duration::from_millis(1_020));
    let err = call.await.unwrap_err();
    let t = throttled(&err);
    assert_eq!(t.status, Status::RateLimited);
    assert_eq!(t.retry_after(), Some(Duration::from_secs(1)));
    assert_eq!(t.attempts, 2);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// In reject mode a closed semaphore was answered `shed` with a retry
/// time; no slot will ever come free, so it is `closed`.
#[tokio::test]
async fn concurrency_limit_in_reject_mode_answers_closed_once_closed() {
    let probe = Probe::default();
    let layer = ConcurrencyLimitLayer::new(1).reject(Duration::from_millis(250));
    let svc = layer.layer(probe.service(|_| std::future::pending::<()>()));
    layer.semaphore().close();
    let err = svc.oneshot(1).await.unwrap_err();
    let t = throttled(&err);
    assert_eq!(t.status, Status::Closed, "{t}");
    assert_eq!(t.retry_after_ms, None);
    assert_eq!(probe.calls(), 0);
}
